"""Usage and pricing (engine/execution/usage.py): exact decimal costs from the provider config's
prices, usage rows and their totals per user and per job type."""

import datetime
import json
from decimal import Decimal

import pytest

from engine.execution.providers import Usage
from engine.execution.usage import (
    Price,
    Pricing,
    call_cost,
    max_call_cost,
    parse_price,
    record_usage,
    usage_totals,
)
from tests.support.helpers import create_job

# ---------------------------------------------------------------- pricing
# The models' prices as AIJOB_PROVIDERS gives them, by (provider, model).
PRICES = {
    'deepseek-chat': {'prompt': '0.27', 'completion': '1.10'},
    'small': {'prompt': 0.1, 'completion': 0.2, 'per': 1000},
}


def pricing():
    entries = {('openai', model): parse_price(model, entry) for model, entry in PRICES.items()}
    return Pricing(dict(entries))


def test_cost_is_exact_decimal_per_million_tokens_by_default():
    cost = pricing().cost('openai', 'deepseek-chat', Usage(1_000_000, 500_000))
    assert cost == Decimal('0.820000')


def test_prices_may_be_per_thousand_tokens_and_json_floats_stay_exact():
    assert pricing().cost('openai', 'small', Usage(3, 3)) == Decimal('0.000900')


def test_a_provider_model_the_config_does_not_price_costs_nothing():
    # A price is a provider's and a model's: the same model at another provider is unpriced.
    assert pricing().cost('other', 'deepseek-chat', Usage(1000, 1000)) == 0
    assert pricing().cost('openai', 'other', Usage(1000, 1000)) == 0
    assert Pricing().cost('openai', 'deepseek-chat', Usage(1000, 1000)) == 0


def test_a_calls_cost_and_its_maximum_are_one_formula():
    price = Price(Decimal('0.27'), Decimal('1.10'), cached_prompt=Decimal('0.07'))
    assert call_cost(price, Usage(1000, 200)) == Decimal('0.000490')
    assert max_call_cost(price, 1000, 200) == Decimal('0.000490')
    assert call_cost(None, Usage(10**6, 10**6)) == max_call_cost(None, 10**6, 10**6) == 0


def test_a_cached_prompt_and_a_batch_lower_a_calls_cost_never_its_maximum():
    price = Price(Decimal('1'), Decimal('2'), 1000, Decimal('0.5'), Decimal('0.4'))
    # 40 prompt tokens at 1, 60 served from the prompt cache at 0.5, 10 completion tokens at 2
    assert call_cost(price, Usage(100, 10, cached_prompt_tokens=60)) == Decimal('0.090000')
    assert call_cost(price, Usage(100, 10, batch=True)) == Decimal('0.048000')  # 0.12 x 0.4
    assert max_call_cost(price, 100, 10) == Decimal('0.12')


def test_a_calls_cost_is_rounded_to_the_stored_places_its_maximum_is_not():
    """What budgets reserve rounds up from the exact maximum: a call too cheap to show in the
    usage row still holds a millionth."""
    price = Price(Decimal('1'), Decimal('1'), per=10**9)
    assert call_cost(price, Usage(400, 0)) == Decimal('0.000000')
    assert max_call_cost(price, 400, 0) == Decimal('0.0000004')


@pytest.mark.parametrize(
    'text',
    [
        '1',
        '{"prompt": "x"}',
        '{"prompt": 1, "per": 0}',
        '{"price": 1}',
        '{"prompt": "-1"}',
    ],
)
def test_a_malformed_price_is_rejected(text):
    with pytest.raises(ValueError):
        parse_price('m', json.loads(text))


def flashcard_job(rt, **kw):
    return create_job(rt, job_type='flashcard_generation', input={'text': 'Some text.'}, **kw)


# ---------------------------------------------------------------- usage totals
def test_usage_totals_per_user_and_per_job_type_count_calls_tokens_cost_and_errors(
    provider_runtime,
):
    job_a = flashcard_job(provider_runtime, user_id='user-a')
    job_b = create_job(provider_runtime, job_type='synthetic', user_id='user-b')
    record_usage(
        job_a,
        1,
        'openai',
        'deepseek-chat',
        Usage(100, 20),
        Decimal('0.000049'),
        900,
        'VALIDATION_JSON',
    )
    record_usage(job_a, 2, 'openai', 'deepseek-chat', Usage(120, 40), Decimal('0.000076'), 800)
    record_usage(job_b, 1, 'synthetic', 'synthetic-1', Usage(5, 5), Decimal('0'), 3)
    since = provider_runtime.store.clock() - datetime.timedelta(hours=1)
    until = provider_runtime.store.clock() + datetime.timedelta(hours=1)
    assert usage_totals(since, until, 'user') == [
        {
            'userId': 'user-a',
            'calls': 2,
            'promptTokens': 220,
            'completionTokens': 60,
            'cost': '0.000125',
            'errors': 1,
        },
        {
            'userId': 'user-b',
            'calls': 1,
            'promptTokens': 5,
            'completionTokens': 5,
            'cost': '0.000000',
            'errors': 0,
        },
    ]
    by_type = usage_totals(since, until, 'job_type')
    assert [(t['jobType'], t['calls']) for t in by_type] == [
        ('flashcard_generation', 2),
        ('synthetic', 1),
    ]


def test_usage_outside_the_range_is_not_counted(provider_runtime):
    job = flashcard_job(provider_runtime)
    record_usage(job, 1, 'openai', 'm', Usage(1, 1), Decimal('1'), 1)
    later = provider_runtime.store.clock() + datetime.timedelta(minutes=5)
    assert usage_totals(later, later + datetime.timedelta(hours=1), 'user') == []


def test_usage_totals_reject_an_unknown_grouping(provider_runtime):
    with pytest.raises(ValueError):
        usage_totals(datetime.datetime(2020, 1, 1), datetime.datetime(2030, 1, 1), 'model')
