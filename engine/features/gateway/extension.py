"""How the gateway joins a runtime: ``GatewayExtension`` builds the routed gateway over the
kernel's (the plugins' providers) and lists it at the hook point ``gateways``, from where the
engine's calls go through it; it puts the provider file's prices at ``prices`` and its guards
(cooldowns, then fallback) among the call guards. Every OpenAI-compatible provider
(AIJOB_PROVIDERS, or the one-provider shorthand written as the same config) is built here and
only here. With no provider configured, nothing changes: no guard, the call path as it was,
every call costing 0."""

from ...core.errors import ConfigError
from ...core.extension import Extension
from .cooldowns import CooldownGuard, cooldown_gauge, open_cooldowns
from .providers_config import load
from .routes import FallbackGuard, RoutedGateway
from .settings import SETTINGS, provider_keys_from


class GatewayExtension(Extension):
    """Routes ``ai``'s provider calls as AIJOB_PROVIDERS (or the shorthand) says: the routed
    gateway, the provider file's prices, cooldowns shared through the queue's Redis (in the
    process on the embedded default), fallback. Its handle is the RoutedGateway, or None with
    no provider configured. Raises ConfigError for a bad provider file."""

    name = 'gateway'
    settings = SETTINGS
    derive = (provider_keys_from,)

    def install(self, kernel, hooks, features):
        ai = kernel.ai
        # Every configured entry's cooldown, read at each scrape (none configured: no sample).
        hooks.gauges.append(lambda: [cooldown_gauge(ai.gateway)])
        table = load(kernel.config)
        if table is None:
            return None
        _check_plugin_providers(table, ai.providers)
        # The provider file is where every price comes from; the routed gateway keeps the
        # plugins' providers (the kernel's gateway) and routes every call from now on.
        hooks.prices.update(table.prices())
        cooldowns = open_cooldowns(kernel.config, kernel.redis)
        gateway = RoutedGateway(
            ai.providers,
            table,
            ai.pricing,
            ai.prompts,
            cooldowns,
            kernel.store,
            kernel.config.budget_max_tokens,
        )
        hooks.gateways.append(gateway)
        if table.routed():
            # Cooldowns and fallback act on route entries: with only a plugin's provider priced
            # and limited, there is none, and no call pays for them.
            guards = [CooldownGuard(cooldowns), FallbackGuard(gateway, kernel.store)]
            hooks.call_guards.extend(guards)
        return gateway


def _check_plugin_providers(table, base):
    """A provider without baseUrl prices and limits a plugin's own: refuse one no plugin has
    (a typo would price nothing and limit nothing, silently)."""
    known = {provider.key for provider in base.providers()}
    for spec in table.providers.values():
        if not spec.routed and spec.name not in known:
            raise ConfigError(
                '%s is invalid: providers.%s has no baseUrl and no plugin provides it '
                "(plugins' providers: %s)" % (table.source, spec.name, ', '.join(sorted(known)))
            )
