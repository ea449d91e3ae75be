"""How the gateway joins a runtime: ``install`` replaces the AI services' gateway with the routed
one and appends the configured guards, once the job types are loaded (the runtime calls it).
With no provider configured, nothing changes: no guard, the call path as it was."""

from .cooldowns import CooldownGuard, open_cooldowns
from .providers_config import load
from .routes import FallbackGuard, RoutedGateway


def install(ai, config, store, redis):
    """Route ``ai``'s provider calls as AIJOB_PROVIDERS (or the shorthand) says and hold them
    with the guards, in the order they must run: the cache first (a hit reserves nothing),
    then cooldowns (a cooling entry is skipped before anything is reserved for it; it hears a
    failure's Retry-After before fallback drops it) and fallback, then budgets and rate
    limits. ``redis`` is the runtime's Redis client, or None on the
    embedded default (state in the process). Raises ConfigError for a bad provider file."""
    table = load(config)
    if table is None:
        return ai
    prices = {
        (spec.name, model.name): model.price
        for spec in table.providers.values()
        for model in spec.models.values()
        if model.price is not None
    }
    ai.pricing = ai.pricing.with_entries(prices)
    cooldowns = open_cooldowns(config, redis)
    gateway = RoutedGateway(
        ai.gateway, table, ai.pricing, ai.prompts, cooldowns, store, config.budget_max_tokens
    )
    ai.gateway = gateway
    ai.guards.extend([CooldownGuard(cooldowns), FallbackGuard(gateway, store)])
    return ai


def entry_limits(gateway):
    """{'provider/model': Limits} of the provider file's models that set ``limits`` (the rate
    limits guard holds them); {} when the gateway is not routed."""
    table = getattr(gateway, 'table', None)
    if table is None:
        return {}
    return {
        '%s/%s' % (spec.name, model.name): model.limits
        for spec in table.providers.values()
        for model in spec.models.values()
        if model.limits is not None
    }
