"""The content safety policy, the price table and the versioned prompt templates."""

import json
from decimal import Decimal

import pytest

from engine.core.config import Config
from engine.core.errors import ConfigError, ContentSafetyError, ProviderRequestError
from engine.execution.prompts import PromptLibrary, PromptTemplate, default_library
from engine.execution.providers import Credential, ProviderRequest, Usage
from engine.execution.safety import RegexContentSafety
from engine.execution.services import build_ai_services
from engine.execution.usage import PriceTableCostCalculator, parse_price_table
from engine.jobtypes.flashcards import FLASHCARD_JOB_DEFINITION, FLASHCARDS_V1


# ---------------------------------------------------------------- content safety
def test_a_configured_pattern_blocks_nested_content_case_insensitively():
    policy = RegexContentSafety.from_list(json.loads(r'["\\bforbidden\\s+topic\\b"]'))
    with pytest.raises(ContentSafetyError) as caught:
        policy.check({'cards': [{'question': 'Q', 'answer': 'a FORBIDDEN  Topic here'}]}, 'output')
    assert caught.value.code == 'CONTENT_SAFETY_BLOCKED' and not caught.value.retryable
    assert 'FORBIDDEN' not in str(caught.value)  # the matched text is never echoed
    assert 'output' in caught.value.public_message


def test_clean_content_passes():
    policy = RegexContentSafety.from_list(json.loads('["forbidden"]'))
    assert policy.check({'text': 'a perfectly fine text', 'n': 3}, 'input') is None


def test_the_default_policy_blocks_private_keys():
    policy = RegexContentSafety.from_list(None)
    with pytest.raises(ContentSafetyError):
        policy.check({'text': 'x -----BEGIN RSA PRIVATE KEY----- y'}, 'input')
    policy.check({'text': 'public keys are fine'}, 'input')


def test_keys_of_objects_are_checked_too():
    with pytest.raises(ContentSafetyError):
        RegexContentSafety.from_list(json.loads('["secret"]')).check({'my secret': 1}, 'input')


# ---------------------------------------------------------------- pricing
TABLE = (
    '{"deepseek-chat": {"prompt": "0.27", "completion": "1.10"},'
    ' "small": {"prompt": 0.1, "completion": 0.2, "per": 1000},'
    ' "*": {"prompt": "1", "completion": "2"}}'
)


def test_cost_is_exact_decimal_per_million_tokens_by_default():
    calc = PriceTableCostCalculator.from_table(json.loads(TABLE))
    cost = calc.cost('openai', 'deepseek-chat', Usage(1_000_000, 500_000))
    assert cost == Decimal('0.820000')


def test_prices_may_be_per_thousand_tokens_and_json_floats_stay_exact():
    calc = PriceTableCostCalculator.from_table(json.loads(TABLE))
    assert calc.cost('openai', 'small', Usage(3, 3)) == Decimal('0.000900')


def test_an_unlisted_model_uses_the_fallback_or_costs_nothing():
    assert PriceTableCostCalculator.from_table(json.loads(TABLE)).cost(
        'x', 'other', Usage(1000, 0)
    ) == Decimal('0.001000')
    assert PriceTableCostCalculator.from_table(None).cost('x', 'other', Usage(1000, 1000)) == 0


@pytest.mark.parametrize(
    'text',
    [
        '[]',
        '{"m": 1}',
        '{"m": {"prompt": "x"}}',
        '{"m": {"prompt": 1, "per": 0}}',
        '{"m": {"price": 1}}',
    ],
)
def test_a_malformed_price_table_is_rejected(text):
    with pytest.raises(ValueError):
        parse_price_table(json.loads(text))


# ---------------------------------------------------------------- prompts
V2 = PromptTemplate(
    job_type='flashcard_generation', version='v2', system='S2 {schema}', user='cards from: {text}'
)


def request(prompt_version=None, attempt=1, job_type='flashcard_generation', input=None):
    return ProviderRequest(
        job_id='j',
        job_type=job_type,
        attempt=attempt,
        input=input or {'text': 'T {not a field}'},
        definition=FLASHCARD_JOB_DEFINITION,
        credential=Credential('x'),
        prompt_version=prompt_version,
    )


def test_the_latest_version_renders_by_default_and_an_older_one_on_request():
    library = PromptLibrary([FLASHCARDS_V1, V2])
    assert library.versions('flashcard_generation') == ['v1', 'v2']
    assert library.render(request())[1]['content'] == 'cards from: T {not a field}'
    assert 'at most 10 flashcards' in library.render(request('v1'))[1]['content']


def test_an_unknown_version_is_a_non_retryable_request_error():
    with pytest.raises(ProviderRequestError) as caught:
        PromptLibrary([FLASHCARDS_V1]).render(request('v7'))
    assert not caught.value.retryable and 'v7' in caught.value.public_message


def test_a_job_type_without_templates_uses_the_generic_one_with_its_schema():
    messages = default_library().render(request(job_type='summary', input={'a': 1}))
    assert '"cards"' in messages[0]['content']  # the definition's output schema
    assert messages[1]['content'] == 'Input (JSON):\n{"a": 1}'


def test_a_retry_adds_a_json_only_reminder():
    first = default_library().render(request())[0]['content']
    retry = default_library().render(request(attempt=2))[0]['content']
    assert 'JSON object only' in retry and 'JSON object only' not in first


# ---------------------------------------------------------------- settings and wiring
@pytest.mark.parametrize(
    'env',
    [
        {'AIJOB_CONTENT_SAFETY_PATTERNS': '["(unclosed"]'},
        {'AIJOB_CONTENT_SAFETY_PATTERNS': '"one string"'},
        {'AIJOB_PRICE_TABLE': '{"m": {"prompt": "-1"}}'},
        {'AIJOB_PROVIDER_BASE_URL': 'ftp://127.0.0.1/v1'},
        {'AIJOB_PROVIDER_MODEL': ''},
    ],
)
def test_bad_ai_settings_stop_start_up(env):
    # The shape is checked when settings are parsed, the meaning when the AI side is built;
    # both happen before a process serves anything.
    with pytest.raises(ConfigError) as caught:
        build_ai_services(Config.from_env(env), store=None)
    assert next(iter(env)) in str(caught.value)


def test_the_gateway_has_only_the_synthetic_provider_until_a_base_url_is_set():
    bare = build_ai_services(Config.from_env({}), store=None)
    assert bare.gateway.provider_for(FLASHCARD_JOB_DEFINITION) is None
    assert not bare.platform_available(FLASHCARD_JOB_DEFINITION)
    configured = build_ai_services(
        Config.from_env(
            {
                'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:8080/v1',
                'AIJOB_PROVIDER_MODEL': 'local',
                'AIJOB_PLATFORM_API_KEY': 'local',
            }
        ),
        store=None,
    )
    provider, model = configured.gateway.route(FLASHCARD_JOB_DEFINITION, job=None)
    assert (provider.key, model, provider.base_url) == (
        'openai',
        'local',
        'http://127.0.0.1:8080/v1',
    )
    assert configured.platform_available(FLASHCARD_JOB_DEFINITION)
