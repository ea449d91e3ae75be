"""How provider rate limits join a runtime."""

from ...core.extension import Extension
from .limiter import RateLimitGuard
from .settings import SETTINGS


class RateLimitsExtension(Extension):
    """Provider rate limits (the provider config's models' ``limits``), held by every worker
    together in the queue's Redis (in the process on the embedded default): the guard last
    among the call guards, so a call refused before books no slot. Off when no limit is set."""

    name = 'rate_limits'
    settings = SETTINGS

    def install(self, kernel, hooks, features):
        gateway = features.get('gateway')
        limits = gateway.table.limits() if gateway is not None else {}
        guard = RateLimitGuard.from_config(kernel.config, kernel.redis, limits)
        if not guard.limits:
            return None
        hooks.call_guards.append(guard)
        return guard
