"""Builds the AI-side collaborators the execution engine resolves a job with: the gateway
(providers and model routing), credentials, content safety and pricing."""
from dataclasses import dataclass, field

from .projectors import ProjectorRegistry

from .providers import (AiGateway, ContentSafety, CostCalculator, CredentialResolver,
                        SyntheticProvider)


@dataclass
class AiServices:
    gateway: AiGateway
    credentials: CredentialResolver
    safety: ContentSafety
    pricing: CostCalculator
    credential_store: object = None     # user keys (issue 5): register/list/delete/decrypt
    projectors: ProjectorRegistry = field(default_factory=ProjectorRegistry)

    def platform_available(self, definition):
        """Can a job of ``definition`` run in platform_key mode here? (No platform key for a
        provider that needs one → PLATFORM_UNAVAILABLE at creation.)"""
        return True


def build_ai_services(config, store):
    """The default: the offline synthetic provider, platform-key credentials, no safety policy
    and zero prices."""
    return AiServices(
        gateway=AiGateway([SyntheticProvider()], default_provider='synthetic'),
        credentials=CredentialResolver(platform_api_key=None),
        safety=ContentSafety(),
        pricing=CostCalculator(),
    )
