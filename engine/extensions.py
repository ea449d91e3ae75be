"""The installed extensions, in order (the protocol: engine/core/extension.py).

The order is the order of the call guards around each provider call, and the order the
extensions install in:
- the response cache first: a hit reserves nothing and calls no provider;
- the gateway's cooldowns, then its fallback: a cooling entry is skipped before anything is
  reserved for it, and a failure's Retry-After is heard before fallback drops the entry;
- budgets: a call's maximum cost reserved (or the job deferred or failed);
- provider batches, after the budgets (a parked call keeps its reservation) and before the rate
  limits (a batch takes no online slot); they settle a cancelled job's billed line against the
  budgets;
- rate limits last: a call refused by anything before books no slot;
- then the features with no call guard, in any order: webhooks, the live text and event
  streams, metrics (they count the kernel's signals and read the others' gauges at scrape time);
- the operators' dashboard last: it shows the panels and pages of the features above.
Removing a feature is removing its line here (and its folder)."""

from .core import config
from .features.batches.extension import BatchesExtension
from .features.budgets.extension import BudgetsExtension
from .features.cache.extension import CacheExtension
from .features.dashboard.extension import DashboardExtension
from .features.gateway.extension import GatewayExtension
from .features.metrics.extension import MetricsExtension
from .features.rate_limits.extension import RateLimitsExtension
from .features.streams.extension import StreamsExtension
from .features.webhooks.extension import WebhooksExtension

INSTALLED = (
    CacheExtension(),
    GatewayExtension(),
    BudgetsExtension(),
    BatchesExtension(),
    RateLimitsExtension(),
    WebhooksExtension(),
    StreamsExtension(),
    MetricsExtension(),
    DashboardExtension(),
)

# Every setting: the kernel's, then each installed feature's (README "Settings" lists them all).
SETTINGS = config.SETTINGS + tuple(s for extension in INSTALLED for s in extension.settings)
TOGETHER = config.TOGETHER + tuple(t for extension in INSTALLED for t in extension.together)


def load_config(environ=None, **overrides):
    """The Config of the kernel and the installed features, from ``environ`` (default
    ``os.environ``) and ``overrides`` (raw strings by env name): what every process and test
    builds its Runtime from. Raises ConfigError with one line for a bad value."""
    derive = tuple(step for extension in INSTALLED for step in extension.derive)
    return config.Config.from_env(environ, SETTINGS, TOGETHER, derive, **overrides)
