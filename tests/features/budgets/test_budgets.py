"""Budgets in money (issue 21 item 5, issue 31), on both backend pairs: the admin API, the
create-time refusal (429, nothing written), the prompt's token bound, the BudgetGuard's
reservation of a call's maximum cost (exact under threads racing for it, and waiting, not
failing, while calls in flight hold the room), its settlement with the usage row, its release
when the call is not made, the reaper's release of a dead worker's reservations, and jobs
through the engine against the loopback provider (issue 31's four cases, 50 jobs each)."""

import datetime
import re
import time
from dataclasses import replace
from decimal import Decimal
from types import SimpleNamespace

import pytest

from engine.core.errors import BudgetExceededFailure, JobDeferred, JobFailure
from engine.core.models import AiJob, AiUsageLog
from engine.core.states import TERMINAL
from engine.execution.providers import ProviderCall, Usage
from engine.execution.usage import Price, record_usage
from engine.features.budgets.guard import BudgetGuard
from engine.features.budgets.ledger import IN_FLIGHT_WAIT_MAX_S, period_reset
from engine.features.budgets.models import AiBudget, AiBudgetReservation, AiBudgetSpend
from engine.features.gateway.openai_client import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    TEMPLATE_TOKENS_PER_REQUEST,
    estimate_tokens,
    prompt_token_bound,
)
from engine.jobtypes.flashcards import flashcard_definition
from tests.features.dashboard.test_dashboard import board  # noqa: F401
from tests.support import budget_cases
from tests.support.api import Harness, job_body, run_to_running
from tests.support.fake_openai import json_reply
from tests.support.helpers import create_job, run_threads, wait_until
from tests.support.provider_configs import one_provider
from tests.support.runtimes import FAST_SETTINGS, PROVIDER_SETTINGS, fast_registry, wait_terminal

BUDGETS = '/admin-api/ai/budgets'
JOBS = '/api/ai/jobs'
# 100 prompt tokens at 1 per 1000 plus 50 completion tokens at 2 per 1000: 0.2 at most. The
# model m of the shorthand's provider (openai), never called: the guard is called directly.
PRICE = {'prompt': '1', 'completion': '2', 'per': 1000}
MAX_COST = Decimal('0.2')


@pytest.fixture
def budget_rt(make_runtime):
    rt = make_runtime(
        registry=fast_registry(),
        **one_provider('http://127.0.0.1:9/v1', model='m', price=PRICE),
        AIJOB_BUDGET_MAX_TOKENS='50',
        **FAST_SETTINGS,
    )
    with rt.store.connection():
        yield rt


@pytest.fixture
def budget_api(budget_rt):
    return Harness(budget_rt)


def put(client, **body):
    return client.request('PUT', BUDGETS, json_body=body)


def guard_of(rt):
    [guard] = [g for g in rt.ai.guards if isinstance(g, BudgetGuard)]
    return guard


def a_call(job, call_no=1):
    """A call to model ``m`` whose prompt is estimated at 100 tokens."""
    provider = SimpleNamespace(key='openai', prompts=None)
    call = ProviderCall(
        job=job, definition=None, request=None, provider=provider, model='m', call_no=call_no
    )
    call.prompt_tokens = 100
    return call


def running_job(rt, user_id='user-a'):
    job = create_job(rt, user_id=user_id)
    run_to_running(rt, job.id)
    return AiJob.get_by_id(job.id)


def spend_of(budget_id):
    row = AiBudgetSpend.get(AiBudgetSpend.budget_id == budget_id)
    return Decimal(row.spent_micros) / 10**6, Decimal(row.reserved_micros) / 10**6


def record_cost(job_or_user, cost, job_type='synthetic'):
    job = SimpleNamespace(
        id='j-%d' % time.monotonic_ns(),
        user_id=job_or_user,
        job_type=job_type,
        attempt_no=1,
        credential_mode='platform_key',
    )
    record_usage(job, 1, 'openai', 'm', Usage(1, 1), Decimal(cost), 5)


# ---------------------------------------------------------------- the admin API
def test_an_admin_creates_lists_replaces_and_deletes_budgets(budget_api):
    record_cost('user-a', '1.5')  # before the budget: its period's spend so far counts
    created = put(budget_api.admin, scope='user', subject='user-a', period='day', amount='10')
    assert created.status == 201, created
    budget = created.json
    assert budget['amount'] == '10.000000' and budget['onExceeded'] == 'fail'
    assert budget['spent'] == '1.500000' and budget['reserved'] == '0.000000'
    assert budget['remaining'] == '8.500000'
    now = budget_api.runtime.store.clock()
    assert budget['resetsAt'].startswith(period_reset('day', now).strftime('%Y-%m-%dT00:00:00'))

    glob = put(budget_api.admin, scope='global', period='total', amount='99.5', onExceeded='wait')
    assert glob.status == 201 and glob.json['resetsAt'] is None and glob.json['subject'] is None
    replaced = put(
        budget_api.admin,
        scope='user',
        subject='user-a',
        period='day',
        amount='12.25',
        onExceeded='wait',
    )
    assert replaced.status == 200 and replaced.json['budgetId'] == budget['budgetId']
    assert replaced.json['amount'] == '12.250000' and replaced.json['onExceeded'] == 'wait'

    listed = budget_api.admin.get(BUDGETS)
    assert listed.status == 200
    assert [(b['scope'], b['spent']) for b in listed.json['items']] == [
        ('global', '1.500000'),
        ('user', '1.500000'),
    ]
    assert budget_api.admin.request('DELETE', BUDGETS + '/' + budget['budgetId']).status == 204
    missing = budget_api.admin.request('DELETE', BUDGETS + '/' + budget['budgetId'])
    assert missing.status == 404 and missing.error_code == 'BUDGET_NOT_FOUND'
    assert [b['scope'] for b in budget_api.admin.get(BUDGETS).json['items']] == ['global']
    assert AiBudgetSpend.select().where(AiBudgetSpend.budget_id == budget['budgetId']).count() == 0


@pytest.mark.parametrize(
    'body, field',
    [
        ({'scope': 'team', 'period': 'day', 'amount': '1'}, 'scope'),
        ({'scope': 'user', 'period': 'day', 'amount': '1'}, 'subject'),
        ({'scope': 'user', 'subject': '  ', 'period': 'day', 'amount': '1'}, 'subject'),
        ({'scope': 'user', 'subject': 'u' * 65, 'period': 'day', 'amount': '1'}, 'subject'),
        ({'scope': 'jobType', 'subject': 'nope', 'period': 'day', 'amount': '1'}, 'subject'),
        ({'scope': 'global', 'subject': 'u', 'period': 'day', 'amount': '1'}, 'subject'),
        ({'scope': 'global', 'period': 'week', 'amount': '1'}, 'period'),
        ({'scope': 'global', 'period': 'day', 'amount': 1}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': '-1'}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': '1.1234567'}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': '123456789'}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': '1e3'}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': 'NaN'}, 'amount'),
        ({'scope': 'global', 'period': 'day'}, 'amount'),
        ({'scope': 'global', 'period': 'day', 'amount': '1', 'onExceeded': 'x'}, 'onExceeded'),
        ({'scope': 'global', 'period': 'day', 'amount': '1', 'owner': 'me'}, 'owner'),
    ],
)
def test_a_bad_budget_is_400_naming_its_field_and_writes_nothing(budget_api, body, field):
    response = budget_api.admin.request('PUT', BUDGETS, json_body=body)
    assert response.status == 400, response
    assert response.error_code == 'INVALID_REQUEST'
    assert response.json['error']['field'] == field
    assert AiBudget.select().count() == 0 and AiBudgetSpend.select().count() == 0


def test_the_largest_amount_fits_the_column(budget_api):
    response = put(budget_api.admin, scope='global', period='month', amount='99999999.999999')
    assert response.status == 201 and response.json['amount'] == '99999999.999999'


def test_users_get_403_on_the_budget_endpoints(budget_api):
    assert put(budget_api.admin, scope='global', period='day', amount='1').status == 201
    budget_id = AiBudget.get().id
    for method, path, body in (
        ('PUT', BUDGETS, {'scope': 'global', 'period': 'day', 'amount': '5'}),
        ('GET', BUDGETS, None),
        ('DELETE', BUDGETS + '/' + budget_id, None),
    ):
        response = budget_api.a.request(method, path, json_body=body)
        assert response.status == 403 and response.error_code == 'FORBIDDEN'
        assert budget_api.anon.request(method, path, json_body=body).status == 401
    assert AiBudget.get().amount == Decimal('1')


def test_the_dashboards_usage_page_shows_each_budget_against_its_spend(board):  # noqa: F811
    rt = board.rt
    record_cost('alice', '1.25')
    rt.features['budgets'].put('user', 'alice', 'month', Decimal('10'), 'wait')
    page = board.operator().get('/dashboard/usage')
    assert page.status == 200
    assert re.search(
        r'<td>user</td><td>alice</td><td>month</td>\s*<td>10.000000</td><td>1.250000</td>'
        r'<td>0.000000</td>\s*<td>8.750000</td><td>wait</td>',
        page.text,
    )
    rt.features['budgets'].delete(AiBudget.get().id)
    assert 'No budget' in board.operator().get('/dashboard/usage').text


# ---------------------------------------------------------------- the create-time refusal
def test_a_create_whose_budget_is_spent_is_429_and_writes_nothing(budget_api):
    record_cost('user-a', '2')
    assert put(budget_api.admin, scope='user', subject='user-a', period='day', amount='2').json
    budget_api.runtime.features[
        'budgets'
    ].forget()  # this process's cache; others see it within a second
    before = AiJob.select().count()
    refused = budget_api.a.post(JOBS, job_body())
    assert refused.status == 429 and refused.error_code == 'BUDGET_EXCEEDED'
    message = refused.json['error']['message']
    assert 'daily user user-a budget (2.000000)' in message and 'resets at' in message
    now = budget_api.runtime.store.clock()
    to_reset = (period_reset('day', now) - now).total_seconds()
    assert abs(int(refused.headers['retry-after']) - to_reset) <= 5
    assert AiJob.select().count() == before
    assert budget_api.b.post(JOBS, job_body()).status == 201  # another user's budget is free

    # A reservation alone refuses no create: the call in flight may spend less than it holds.
    rt = budget_api.runtime
    put(budget_api.admin, scope='user', subject='user-b', period='month', amount='0.2')
    guard, call = guard_of(rt), a_call(running_job(rt, 'user-b'))
    guard.before(call)
    assert spend_of(AiBudget.get(AiBudget.subject == 'user-b').id) == (0, MAX_COST)
    assert budget_api.b.post(JOBS, job_body()).status == 201
    # Its spend does, once it reaches the amount.
    rt.store.run_in_transaction(lambda tx: guard.settle(call, Usage(100, 50), MAX_COST, None))
    refused = budget_api.b.post(JOBS, job_body())
    assert (
        refused.status == 429 and 'monthly user user-b budget' in refused.json['error']['message']
    )


def test_a_spent_total_budget_names_no_reset(budget_api):
    put(budget_api.admin, scope='jobType', subject='synthetic', period='total', amount='0')
    refused = budget_api.a.post(JOBS, job_body())
    assert refused.status == 429 and 'retry-after' not in refused.headers
    assert 'does not reset' in refused.json['error']['message']


def test_without_budgets_a_create_reads_no_spend(budget_rt):
    budgets = budget_rt.features['budgets']
    budgets.all()  # the list is read once, then trusted for a second
    statements = budget_rt.store.statement_count()
    budgets.check_creatable('user-a', 'synthetic')
    assert budget_rt.store.statement_count() == statements


# ---------------------------------------------------------------- the prompt's bound
# Chat templates as their tokenizers see them: special tokens (one token each) and text.
SPECIAL_TOKENS = {
    '<|start|>',
    '<|message|>',
    '<|end|>',
    '<|im_start|>',
    '<|im_end|>',
    '<|begin_of_text|>',
    '<|start_header_id|>',
    '<|end_header_id|>',
    '<|eot_id|>',
}
LLAMA_PREAMBLE = 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n'
TEMPLATES = {
    # OpenAI's own count: 3 tokens a message, 3 to open the reply.
    'openai': (
        [],
        lambda m: ['<|start|>', m['role'], '<|message|>', m['content'], '<|end|>'],
        ['<|start|>', 'assistant', '<|message|>'],
    ),
    # ChatML (Qwen 2.5, Yi, DeepSeek's distilled models).
    'chatml': (
        [],
        lambda m: ['<|im_start|>', m['role'] + '\n' + m['content'], '<|im_end|>', '\n'],
        ['<|im_start|>', 'assistant\n'],
    ),
    # Llama 3.1, with the preamble it writes into the system message.
    'llama3.1': (
        ['<|begin_of_text|>'],
        lambda m: [
            '<|start_header_id|>',
            m['role'],
            '<|end_header_id|>',
            '\n\n' + (LLAMA_PREAMBLE if m['role'] == 'system' else '') + m['content'],
            '<|eot_id|>',
        ],
        ['<|start_header_id|>', 'assistant', '<|end_header_id|>', '\n\n'],
    ),
}
TEXTS = {
    'ascii': 'Paris is the capital of France. ' * 20,
    'cjk': '巴黎是法国的首都，位于塞纳河畔。' * 20,
    'emoji': '👍🏽 👨\u200d👩\u200d👧 🇫🇷 ✨' * 20,
    'mixed': 'Élève: 東京 is Tokyo 🗼, «naïve» café. ' * 20,
}


def worst_count(messages, template):
    """The tokens of ``messages`` in ``template`` at one token per byte of text, the template's
    own text included (more than any byte-level BPE tokenizer can count), one per special
    token."""
    opening, per_message, reply = TEMPLATES[template]
    pieces = opening + [p for m in messages for p in per_message(m)] + reply
    return sum(1 if p in SPECIAL_TOKENS else len(p.encode('utf-8')) for p in pieces)


def chat(*contents):
    """A system message and alternating user and assistant messages."""
    roles = ['system'] + ['user', 'assistant'] * len(contents)
    return [{'role': role, 'content': text} for role, text in zip(roles, contents, strict=False)]


@pytest.mark.parametrize('template', sorted(TEMPLATES))
@pytest.mark.parametrize('text', sorted(TEXTS))
def test_the_prompt_bound_covers_every_template_at_a_token_per_byte(template, text):
    for messages in (
        chat('Reply with JSON.', TEXTS[text]),
        chat('', TEXTS[text]),
        chat('Reply with JSON.', TEXTS[text], '{"a": 1}', TEXTS[text][:7], 'again'),
    ):
        assert prompt_token_bound(messages) >= worst_count(messages, template)


def test_the_prompt_bound_is_the_bytes_of_each_message_and_the_allowances():
    per_request, per_message = TEMPLATE_TOKENS_PER_REQUEST, TEMPLATE_TOKENS_PER_MESSAGE
    assert prompt_token_bound([]) == per_request
    assert prompt_token_bound(chat('abc')) == per_request + len('system') + 3 + per_message
    # Chinese is 3 bytes a character: 12 times what characters ÷ 4 guessed, 4 times the count
    # of a tokenizer that finds 3 tokens where that guess found one.
    cjk = chat('', '巴黎' * 100)
    assert prompt_token_bound(cjk) == per_request + 6 + 4 + 600 + 2 * per_message
    assert prompt_token_bound(cjk) > 3 * estimate_tokens(cjk)
    # An emoji is 4 bytes; a family joined by zero-width joiners is 18.
    assert prompt_token_bound(chat('👍')) == per_request + 6 + 4 + per_message
    family = '👨\u200d👩\u200d👧'
    assert prompt_token_bound(chat(family)) == per_request + 6 + 18 + per_message
    # Each message adds its role, its content and the allowance.
    two, four = chat('s', 'u'), chat('s', 'u', 'a', 'u')
    assert prompt_token_bound(four) - prompt_token_bound(two) == (
        len('assistant') + len('user') + 2 + 2 * per_message
    )


# ---------------------------------------------------------------- the guard
def test_a_call_reserves_its_maximum_cost_and_settles_its_real_cost(budget_api):
    rt = budget_api.runtime
    put(budget_api.admin, scope='user', subject='user-a', period='day', amount='1')
    put(budget_api.admin, scope='global', period='month', amount='5')
    rt.features['budgets'].forget()
    guard, call = guard_of(rt), a_call(running_job(rt))
    assert guard.max_cost_micros(call) == 200_000
    assert guard.before(call) is None
    assert [b['reserved'] for b in budget_api.admin.get(BUDGETS).json['items']] == ['0.200000'] * 2
    guard.after(call, Usage(10, 10), None)  # the call was made: its usage row settles it
    assert AiBudgetReservation.select().count() == 1

    rt.store.run_in_transaction(lambda tx: guard.settle(call, Usage(10, 10), Decimal('0.03'), None))
    items = budget_api.admin.get(BUDGETS).json['items']
    assert [(b['spent'], b['reserved']) for b in items] == [('0.030000', '0.000000')] * 2
    assert AiBudgetReservation.select().count() == 0


def test_a_settle_rolled_back_with_its_transaction_leaves_the_reservation(budget_rt):
    budget_rt.features['budgets'].put('global', '', 'day', Decimal('1'), 'fail')
    guard, call = guard_of(budget_rt), a_call(running_job(budget_rt))
    guard.before(call)

    def settle_then_fail(tx):
        guard.settle(call, Usage(1, 1), Decimal('0.1'), None)
        raise RuntimeError('the group commit failed')

    with pytest.raises(RuntimeError):
        budget_rt.store.run_in_transaction(settle_then_fail)
    assert spend_of(AiBudget.get().id) == (0, MAX_COST)
    budget_rt.store.run_in_transaction(
        lambda tx: guard.settle(call, Usage(1, 1), Decimal('0.1'), None)
    )
    assert spend_of(AiBudget.get().id) == (Decimal('0.1'), 0)


def spend_in_full(rt, guard, call):
    """``call``'s usage row settles it at its maximum cost."""
    rt.store.run_in_transaction(lambda tx: guard.settle(call, Usage(100, 50), MAX_COST, None))


def second_call_refused(rt, scope, subject, period, on_exceeded, refusal):
    """Under a budget of 0.3, which one call's MAX_COST fits and two do not, the first call is
    let through and spends its maximum, and the second raises ``refusal``: returns it."""
    rt.features['budgets'].put(scope, subject, period, Decimal('0.3'), on_exceeded)
    guard, first = guard_of(rt), a_call(running_job(rt))
    guard.before(first)
    spend_in_full(rt, guard, first)
    with pytest.raises(refusal) as refused:
        guard.before(a_call(running_job(rt)))
    return refused.value


def test_a_call_over_a_fail_budget_fails_the_job_without_retry(budget_rt):
    failure = second_call_refused(budget_rt, 'user', 'user-a', 'day', 'fail', BudgetExceededFailure)
    assert isinstance(failure, JobFailure) and failure.code == 'BUDGET_EXCEEDED'
    assert not failure.retryable and not failure.may_retry('retry', 0)
    assert 'daily user user-a budget' in failure.public_message
    assert AiBudgetReservation.select().count() == 0
    assert spend_of(AiBudget.get().id) == (MAX_COST, 0)


def test_a_call_over_a_wait_budget_is_deferred_until_the_period_resets(budget_rt):
    deferred = second_call_refused(budget_rt, 'global', '', 'month', 'wait', JobDeferred)
    now = budget_rt.store.clock()
    assert deferred.reason == 'budget'
    assert abs(deferred.delay_s - (period_reset('month', now) - now).total_seconds()) < 5
    assert deferred.detail == {'budgetIds': [AiBudget.get().id]}


@pytest.mark.parametrize('on_exceeded', ['fail', 'wait'])
def test_a_call_that_fits_once_the_calls_in_flight_settle_waits_for_them(budget_rt, on_exceeded):
    budget_rt.features['budgets'].put('global', '', 'day', Decimal('0.3'), on_exceeded)
    guard, first = guard_of(budget_rt), a_call(running_job(budget_rt))
    guard.before(first)
    second = a_call(running_job(budget_rt))
    with pytest.raises(JobDeferred) as deferred:
        guard.before(second)  # spent 0 + reserved 0.2 + 0.2 > 0.3, but spent 0 + 0.2 fits
    assert deferred.value.reason == 'budget'
    assert deferred.value.detail == {'budgetIds': [AiBudget.get().id], 'inFlight': True}
    assert 0 < deferred.value.delay_s <= IN_FLIGHT_WAIT_MAX_S * 1.25
    assert spend_of(AiBudget.get().id) == (0, MAX_COST)  # the deferred call reserved nothing

    # The call in flight spent a tenth of its maximum: the next try of the second one fits.
    budget_rt.store.run_in_transaction(
        lambda tx: guard.settle(first, Usage(10, 5), MAX_COST / 10, None)
    )
    assert guard.before(second) is None
    assert spend_of(AiBudget.get().id) == (MAX_COST / 10, MAX_COST)


def test_wait_fails_all_the_same_when_the_call_alone_is_over_the_budget(budget_rt):
    budget_rt.features['budgets'].put('global', '', 'day', Decimal('0.1'), 'wait')
    with pytest.raises(BudgetExceededFailure):
        guard_of(budget_rt).before(a_call(running_job(budget_rt)))


def test_a_call_that_is_not_made_gives_its_reservation_back(budget_rt):
    budget_rt.features['budgets'].put('global', '', 'day', Decimal('1'), 'fail')
    guard = guard_of(budget_rt)
    deferred = a_call(running_job(budget_rt))
    guard.before(deferred)
    guard.after(deferred, None, JobDeferred(1.0, 'rate_limit'))  # a later guard deferred it
    assert spend_of(AiBudget.get().id) == (0, 0)
    assert AiBudgetReservation.select().count() == 0
    # A settle after the release (the engine wrote a usage row after all) only adds the spend.
    budget_rt.store.run_in_transaction(
        lambda tx: guard.settle(deferred, Usage(1, 1), Decimal('0.05'), None)
    )
    assert spend_of(AiBudget.get().id) == (Decimal('0.05'), 0)


def test_no_budget_no_reservation(budget_rt):
    call = a_call(running_job(budget_rt))
    guard_of(budget_rt).before(call)
    assert call.notes == {} and AiBudgetReservation.select().count() == 0


def test_the_maximum_cost_is_the_rendered_prompts_bound_at_the_configured_price(budget_rt):
    definition = budget_rt.registry.get('synthetic')
    prompts = budget_rt.ai.prompts
    request = SimpleNamespace(
        job_type='synthetic',
        prompt_version=None,
        input={'text': 'x' * 400},
        definition=definition,
        attempt=1,
    )
    call = ProviderCall(
        job=None,
        definition=definition,
        request=request,
        provider=SimpleNamespace(key='openai', prompts=prompts),
        model='m',
        call_no=1,
    )
    bound = prompt_token_bound(prompts.render(request))
    assert bound > 400 > 4 * estimate_tokens(prompts.render(request)) - 400
    expected = (Decimal(bound) * 1 + 50 * 2) / 1000
    assert guard_of(budget_rt).max_cost_micros(call) == int(expected * 10**6)


def test_a_calls_own_price_and_the_configured_price_give_the_same_maximum(budget_rt):
    """One formula (usage.max_call_cost) whichever price applies: the one the call carries (the
    route entry's), else the provider config's for its provider and model."""
    table_priced = a_call(running_job(budget_rt))
    entry_priced = replace(
        table_priced, model='unpriced', price=Price(Decimal(1), Decimal(2), 1000)
    )
    guard = guard_of(budget_rt)
    assert guard.max_cost_micros(entry_priced) == guard.max_cost_micros(table_priced) > 0


# ---------------------------------------------------------------- exact under concurrency
def test_threads_racing_for_one_budget_reserve_exactly_what_fits(budget_rt):
    budget_rt.features['budgets'].put(
        'jobType', 'synthetic', 'day', Decimal('1.4'), 'fail'
    )  # 7 calls
    guard = guard_of(budget_rt)
    jobs = [running_job(budget_rt, 'racer-%d' % i) for i in range(20)]

    calls = [a_call(job) for job in jobs]
    results, errors = run_threads(20, lambda i: guard.before(calls[i]), budget_rt.store)
    waiting = [i for i, e in enumerate(errors) if e is not None]
    assert all(isinstance(errors[i], JobDeferred) for i in waiting), errors
    assert len(waiting) == 13  # each would fit alone: it waits for the calls in flight
    assert AiBudgetReservation.select().count() == 7
    assert spend_of(AiBudget.get().id) == (0, Decimal('1.4'))

    # The seven spend their maximum: the budget is spent, the thirteen fail on their next try.
    for i in set(range(20)) - set(waiting):
        spend_in_full(budget_rt, guard, calls[i])
    results, errors = run_threads(13, lambda n: guard.before(calls[waiting[n]]), budget_rt.store)
    assert all(isinstance(e, BudgetExceededFailure) for e in errors), errors
    assert spend_of(AiBudget.get().id) == (Decimal('1.4'), 0)


# ---------------------------------------------------------------- the reaper
def test_the_reaper_releases_the_reservations_of_lost_locks_only(budget_rt):
    budget_rt.features['budgets'].put('global', '', 'day', Decimal('10'), 'fail')
    guard = guard_of(budget_rt)
    alive, dead, finished = (running_job(budget_rt, u) for u in ('u1', 'u2', 'u3'))
    for job in (alive, dead, finished):
        guard.before(a_call(job))
    expired = datetime.datetime(2000, 1, 1)
    AiJob.update(lock_until=expired).where(AiJob.id == dead.id).execute()
    AiJob.update(lifecycle_status='failed').where(AiJob.id == finished.id).execute()

    counts = budget_rt.reaper.sweep()
    assert counts['reservations_released'] == 2
    [left] = AiBudgetReservation.select()
    assert left.job_id == alive.id
    assert spend_of(AiBudget.get().id) == (0, MAX_COST)
    assert budget_rt.reaper.sweep()['reservations_released'] == 0


def test_a_takeover_releases_the_reservation_of_the_attempt_it_replaces(budget_rt):
    budget_rt.features['budgets'].put('global', '', 'day', MAX_COST, 'fail')  # one call at a time
    guard, job = guard_of(budget_rt), running_job(budget_rt)
    guard.before(a_call(job))  # then its worker dies, holding the reservation
    AiJob.update(lock_until=datetime.datetime(2000, 1, 1)).where(AiJob.id == job.id).execute()
    taken = budget_rt.lifecycle.lock_job(job.id, 'another-worker')
    assert taken.attempt_no == 2
    guard.before(a_call(taken))  # fits: the dead attempt's reservation went first
    [left] = AiBudgetReservation.select()
    assert left.attempt_no == 2
    assert spend_of(AiBudget.get().id) == (0, MAX_COST)


# ---------------------------------------------------------------- through the engine
CARDS = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}]}
CARD_INPUT = {'text': 'Paris is the capital of France.', 'maxCards': 1}


@pytest.fixture
def ai_budget_rt(make_runtime, fake):
    registry = fast_registry(flashcard_definition(timeout_ms=10_000, max_retries=2, backoff_ms=20))
    rt = make_runtime(
        registry=registry,
        AIJOB_PLATFORM_API_KEY=PROVIDER_SETTINGS['AIJOB_PLATFORM_API_KEY'],
        **one_provider(
            fake.base_url, model='m', price={'prompt': '1', 'completion': '1', 'per': 1}
        ),
        AIJOB_BUDGET_MAX_TOKENS='20',
        **FAST_SETTINGS,
    )
    with rt.store.connection():
        rt.start_background()
        yield rt
        rt.stop_background(timeout_s=5)


def prompt_bound(rt, job_type, input):
    """What the guard reserves as the prompt of the first call of such a job (its rendered
    messages' bound)."""
    request = SimpleNamespace(
        job_type=job_type,
        prompt_version=None,
        input=input,
        definition=rt.registry.get(job_type),
        attempt=1,
    )
    return prompt_token_bound(rt.ai.prompts.render(request))


def test_jobs_through_the_engine_spend_at_most_their_budget(ai_budget_rt, fake):
    rt = ai_budget_rt
    prompt = prompt_bound(rt, 'flashcard_generation', CARD_INPUT)
    # Each call answers with its maximum: the prompt's bound and all 20 completion tokens.
    fake.script(json_reply(CARDS, usage={'prompt_tokens': prompt, 'completion_tokens': 20}))
    max_cost = Decimal(prompt + 20)
    rt.features['budgets'].put('user', 'user-a', 'day', 3 * max_cost, 'fail')
    # Every create goes in, whatever the calls already reserved: the calls are what is counted
    # here (the refusal at create is tested above).
    rt.service.create_checks = ()
    jobs = [
        create_job(rt, job_type='flashcard_generation', user_id='user-a', input=CARD_INPUT)
        for _ in range(6)
    ]
    finished = [wait_terminal(rt, job.id) for job in jobs]
    outcomes = sorted((job.lifecycle_status, job.error_code) for job in finished)
    assert outcomes == [('failed', 'BUDGET_EXCEEDED')] * 3 + [('succeeded', None)] * 3
    assert len(fake.requests) == 3
    costs = [row.cost for row in AiUsageLog.select() if row.error_code is None]
    assert sum(costs) == 3 * max_cost
    assert spend_of(AiBudget.get().id) == (3 * max_cost, 0)
    assert AiBudgetReservation.select().count() == 0


# ---------------------------------------------------------------- issue 31's four cases
@pytest.fixture
def fifty_rt(make_runtime, fake):
    rt = make_runtime(
        AIJOB_PLATFORM_API_KEY=PROVIDER_SETTINGS['AIJOB_PLATFORM_API_KEY'],
        **one_provider(fake.base_url, model='m', price=budget_cases.PRICE),
        AIJOB_BUDGET_MAX_TOKENS=str(budget_cases.MAX_TOKENS),
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
        **dict(FAST_SETTINGS, AIJOB_INTERACTIVE_CONCURRENCY='8'),
    )
    # Every create goes in: the calls are what is counted here.
    rt.service.create_checks = ()
    with rt.store.connection():
        rt.start_background()
        yield rt
        rt.stop_background(timeout_s=5)


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(budget_cases.CASES))
def test_fifty_jobs_in_one_process_spend_at_most_their_budget_and_none_is_refused_with_room(
    fifty_rt, fake, case
):
    rt = fifty_rt
    input, reply = budget_cases.CASES[case]
    fake.script(replace(reply, first_delay_s=0.05))
    cost = budget_cases.max_cost(rt, input)
    budget, _ = rt.features['budgets'].put('user', 'fifty', 'day', Decimal(10 * cost), 'fail')
    jobs = [
        create_job(rt, job_type='flashcard_generation', user_id='fifty', input=input)
        for _ in range(budget_cases.JOBS)
    ]
    ids = [job.id for job in jobs]
    wait_until(
        lambda: (
            AiJob.select()
            .where(AiJob.id.in_(ids) & AiJob.lifecycle_status.not_in(list(TERMINAL)))
            .count()
            == 0
        ),
        timeout=120,
        interval=0.2,
    )
    run = budget_cases.outcome(budget, 'fifty', ids, cost, fake)
    print(budget_cases.check(case, run))
