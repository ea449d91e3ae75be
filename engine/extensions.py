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
- rate limits last: a call refused by anything before books no slot.
Removing a feature is removing its line here (and its folder)."""

from .features.batches.extension import BatchesExtension
from .features.budgets.extension import BudgetsExtension
from .features.cache.extension import CacheExtension
from .features.gateway.extension import GatewayExtension
from .features.rate_limits.extension import RateLimitsExtension

INSTALLED = (
    CacheExtension(),
    GatewayExtension(),
    BudgetsExtension(),
    BatchesExtension(),
    RateLimitsExtension(),
)
