"""Builds the AI-side collaborators the execution engine resolves a job with: the gateway
(providers and model routing), credentials, content safety, pricing and projectors."""
from dataclasses import dataclass, field

from .credentials import CredentialStore, StoredCredentialResolver, decode_master_key
from .errors import InvalidRequestError, PlatformUnavailableError
from .flashcards import FlashcardProjector
from .openai_provider import OpenAICompatibleProvider
from .pricing import PriceTableCostCalculator
from .projectors import ProjectorRegistry
from .providers import (AiGateway, ContentSafety, CostCalculator, CredentialResolver,
                        SyntheticProvider)
from .safety import RegexContentSafety


@dataclass
class AiServices:
    gateway: AiGateway
    credentials: CredentialResolver
    safety: ContentSafety
    pricing: CostCalculator
    credential_store: object = None     # CredentialStore: users' keys, register/list/delete
    projectors: ProjectorRegistry = field(default_factory=ProjectorRegistry)
    platform_key_configured: bool = False

    def platform_available(self, definition):
        """Can a job of ``definition`` run in platform_key mode here? Not when its provider is
        not configured, nor when the provider needs a key and no platform key is set
        (→ PLATFORM_UNAVAILABLE at creation)."""
        provider = self.gateway.provider_for(definition)
        if provider is None:
            return False
        return self.platform_key_configured or not getattr(provider, 'needs_api_key', False)

    def check_creatable(self, definition, overrides):
        """Refuse at creation what could only fail once the job runs: a job type whose provider
        is not configured, platform mode without a platform key (PLATFORM_UNAVAILABLE), or a
        promptVersion the provider has no template for."""
        provider = self.gateway.provider_for(definition)
        mode = overrides.get('credentialMode') or definition.credential.default_mode
        if provider is None or (mode == 'platform_key' and not self.platform_available(definition)):
            raise PlatformUnavailableError('%s cannot run here: provider %s not configured or no '
                                           'platform key' % (definition.job_type, definition.provider))
        version = overrides.get('promptVersion')
        prompts = getattr(provider, 'prompts', None)
        if version is not None and prompts is not None \
                and version not in prompts.versions(definition.job_type):
            raise InvalidRequestError('overrides.promptVersion %r is unknown for %s (known: %s)'
                                      % (version, definition.job_type,
                                         ', '.join(prompts.versions(definition.job_type))),
                                      field='overrides.promptVersion')


def build_ai_services(config, store):
    """The synthetic provider always; the OpenAI-compatible provider when
    ``AIJOB_PROVIDER_BASE_URL`` is set; stored user keys when a master key is set."""
    providers = [SyntheticProvider()]
    if config.provider_base_url:
        providers.append(OpenAICompatibleProvider(
            config.provider_base_url, config.provider_model,
            read_timeout_s=config.provider_read_timeout_ms / 1000.0))
    master_key = (decode_master_key(config.credential_master_key)
                  if config.credential_master_key else None)
    credential_store = CredentialStore(store, master_key)
    return AiServices(
        gateway=AiGateway(providers, default_provider='synthetic'),
        credentials=StoredCredentialResolver(config.platform_api_key, credential_store),
        safety=RegexContentSafety.from_text(config.content_safety_patterns),
        pricing=PriceTableCostCalculator.from_text(config.price_table),
        credential_store=credential_store,
        projectors=ProjectorRegistry([FlashcardProjector()]),
        platform_key_configured=bool(config.platform_api_key),
    )
