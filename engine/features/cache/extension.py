"""How the response cache joins a runtime."""

from ...core.extension import Extension
from .guard import CacheGuard, purge_expired
from .models import TABLES


class CacheExtension(Extension):
    """The response cache: its guard first among the call guards when a registered definition
    opts in (with none, no guard: no cost on the call path); its expired entries purged in any
    case (a definition may have opted out since they were written)."""

    name = 'cache'

    def install(self, kernel, hooks, features):
        hooks.tables.append(TABLES)
        hooks.purge_steps.append(('cache_entries', purge_expired))
        if not any(definition.cache is not None for definition in kernel.registry.get_all()):
            return None
        guard = CacheGuard(kernel.store, signals=kernel.signals)
        hooks.call_guards.append(guard)
        return guard
