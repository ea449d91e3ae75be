"""The AI side built from settings (engine/execution/services.py): bad settings stop start-up;
the kernel's gateway holds the plugins' providers only, and an OpenAI-compatible provider is
routed by the gateway extension once one is configured."""

import pytest

from engine.core.errors import ConfigError
from engine.execution.services import build_ai_services
from engine.extensions import load_config
from engine.jobtypes.flashcards import FLASHCARD_JOB_DEFINITION


# ---------------------------------------------------------------- settings and wiring
@pytest.mark.parametrize(
    'env',
    [
        {'AIJOB_CONTENT_SAFETY_PATTERNS': '["(unclosed"]'},
        {'AIJOB_CONTENT_SAFETY_PATTERNS': '"one string"'},
        {'AIJOB_PROVIDER_BASE_URL': 'ftp://127.0.0.1/v1'},
        {'AIJOB_PROVIDER_MODEL': ''},
    ],
)
def test_bad_ai_settings_stop_start_up(env):
    # The shape is checked when settings are parsed, the meaning when the AI side is built;
    # both happen before a process serves anything.
    with pytest.raises(ConfigError) as caught:
        build_ai_services(load_config(env), store=None)
    assert next(iter(env)) in str(caught.value)


def test_the_kernels_gateway_reads_no_provider_setting():
    settings = load_config(
        {
            'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:8080/v1',
            'AIJOB_PROVIDER_MODEL': 'local',
            'AIJOB_PLATFORM_API_KEY': 'local',
        }
    )
    for config in (load_config({}), settings):
        services = build_ai_services(config, store=None)
        assert [p.key for p in services.gateway.providers()] == []  # the plugins add theirs
        assert services.gateway.provider_for(FLASHCARD_JOB_DEFINITION) is None
        assert not services.platform_available(FLASHCARD_JOB_DEFINITION)


def test_the_gateway_has_only_the_synthetic_provider_until_a_base_url_is_set(make_runtime):
    bare = make_runtime()
    assert bare.ai.gateway.provider_for(FLASHCARD_JOB_DEFINITION) is None
    assert not bare.ai.platform_available(FLASHCARD_JOB_DEFINITION)
    configured = make_runtime(
        AIJOB_PROVIDER_BASE_URL='http://127.0.0.1:8080/v1',
        AIJOB_PROVIDER_MODEL='local',
        AIJOB_PLATFORM_API_KEY='local',
    )
    provider, model = configured.ai.gateway.route(FLASHCARD_JOB_DEFINITION, job=None)
    assert (provider.key, model, provider.base_url) == (
        'openai',
        'local',
        'http://127.0.0.1:8080/v1',
    )
    assert configured.ai.platform_available(FLASHCARD_JOB_DEFINITION)
    # One client for the one provider: the routed gateway's, no other built beside it.
    openai = [p for p in configured.ai.gateway.providers() if p.key == 'openai']
    assert openai == [provider]
