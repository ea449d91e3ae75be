"""The AI-side collaborators the execution engine resolves a job with: the gateway (providers
and model routing), credentials, content safety, pricing, prompt templates and projectors.

Job types fill them through their plugin's ``register(app)`` (plugins.py); this module knows no
job type by name.
"""

from dataclasses import dataclass, field

from ..core.errors import ConfigError, InvalidRequestError, PlatformUnavailableError
from .credentials import CredentialResolver, CredentialStore
from .projectors import ProjectorRegistry
from .prompts import PromptLibrary, default_library
from .providers import AiGateway
from .safety import RegexContentSafety
from .usage import Pricing


@dataclass
class AiServices:
    providers: AiGateway  # the kernel's gateway: the plugins' providers, by key
    credentials: CredentialResolver
    safety: RegexContentSafety
    pricing: Pricing  # every call costs 0 until the gateway adds the provider config's prices
    credential_store: object = None  # CredentialStore: users' keys, register/list/delete
    projectors: ProjectorRegistry = field(default_factory=ProjectorRegistry)
    prompts: PromptLibrary = field(default_factory=default_library)
    platform_key_configured: bool = False
    # CallGuards held around every provider call, in order (providers.CallGuard); none by default.
    guards: list = field(default_factory=list)
    # Gateways features build over ``providers`` (the hook point ``gateways``): the last routes.
    gateways: list = field(default_factory=list)

    @property
    def gateway(self):
        """The gateway the engine calls: the last a feature installed, else the kernel's."""
        return self.gateways[-1] if self.gateways else self.providers

    def platform_available(self, definition):
        """Can a job of ``definition`` run in platform_key mode here? Not when its provider is
        not configured, nor when the provider needs a key and no platform key is set
        (→ PLATFORM_UNAVAILABLE at creation)."""
        return self.gateway.platform_available(definition, self.platform_key_configured)

    def prompt_versions(self, definition):
        """The promptVersion values a job of ``definition`` may name here (the OpenAPI document
        lists them); None when its provider keeps no templates (any value goes)."""
        prompts = getattr(self.gateway.provider_for(definition), 'prompts', None)
        return None if prompts is None else list(prompts.versions(definition.job_type))

    def check_creatable(self, definition, overrides):
        """Refuse at creation what could only fail once the job runs: a job type whose provider
        is not configured, platform mode without a platform key (PLATFORM_UNAVAILABLE), or a
        promptVersion the provider has no template for."""
        provider = self.gateway.provider_for(definition)
        mode = overrides.get('credentialMode') or definition.credential.default_mode
        if provider is None or (mode == 'platform_key' and not self.platform_available(definition)):
            raise PlatformUnavailableError(
                '%s cannot run here: provider %s not configured or no platform key'
                % (definition.job_type, definition.provider)
            )
        version = overrides.get('promptVersion')
        known = self.prompt_versions(definition)
        if version is not None and known is not None:
            if version not in known:
                raise InvalidRequestError(
                    'overrides.promptVersion %r is unknown for %s (known: %s)'
                    % (version, definition.job_type, ', '.join(known)),
                    field='overrides.promptVersion',
                )


def build_ai_services(config, store, guards=None, gateways=None, prices=None):
    """The kernel's AI services: stored user keys when a master key is set, the gateway of the
    plugins' own providers (the offline synthetic one; job-type plugins add theirs, their
    projectors and prompts). An OpenAI-compatible provider is the gateway extension's
    (engine/features/gateway/extension.py): this module reads no provider setting.
    ``guards``, ``gateways``, ``prices``: the hook points the extensions fill (call_guards,
    gateways, prices: core/extension.py)."""
    prompts = default_library()
    credential_store = CredentialStore(store, config.credential_master_key)
    return AiServices(
        providers=AiGateway(default_provider='synthetic'),
        credentials=CredentialResolver(config.platform_api_key, credential_store),
        safety=_configured(
            'AIJOB_CONTENT_SAFETY_PATTERNS',
            RegexContentSafety.from_list,
            config.content_safety_patterns,
        ),
        pricing=Pricing(prices),
        credential_store=credential_store,
        prompts=prompts,
        platform_key_configured=bool(config.platform_api_key),
        guards=[] if guards is None else guards,
        gateways=[] if gateways is None else gateways,
    )


def _configured(env, build, value):
    """``build(value)``, a ValueError becoming the start-up error that names the setting."""
    try:
        return build(value)
    except ValueError as exc:
        raise ConfigError('%s is invalid: %s' % (env, exc)) from None
