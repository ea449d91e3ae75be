"""Budgets in money (issue 21 item 5), on both backend pairs: the admin API, the create-time
refusal (429, nothing written), the BudgetGuard's reservation of a call's maximum cost (exact
under threads racing for it), its settlement with the usage row, its release when the call is
not made, the reaper's release of a dead worker's reservations, and jobs through the engine
against the loopback provider."""

import datetime
import re
import time
from decimal import Decimal
from types import SimpleNamespace

import pytest

from engine.core.errors import BudgetExceededFailure, JobDeferred, JobFailure
from engine.core.models import (
    AiBudget,
    AiBudgetReservation,
    AiBudgetSpend,
    AiJob,
    AiUsageLog,
)
from engine.execution.openai_client import estimate_tokens
from engine.execution.providers import ProviderCall, Usage
from engine.execution.usage import record_usage
from engine.gateway.budgets import BudgetGuard, period_reset
from engine.jobtypes.flashcards import flashcard_definition
from tests.support.api import Harness, job_body, run_to_running
from tests.support.fake_openai import json_reply
from tests.support.helpers import create_job, run_threads
from tests.support.runtimes import FAST_SETTINGS, PROVIDER_SETTINGS, fast_registry, wait_terminal
from tests.test_dashboard import board  # noqa: F401

BUDGETS = '/admin-api/ai/budgets'
JOBS = '/api/ai/jobs'
# 100 prompt tokens at 1 per 1000 plus 50 completion tokens at 2 per 1000: 0.2 at most.
PRICES = '{"m": {"prompt": "1", "completion": "2", "per": 1000}}'
MAX_COST = Decimal('0.2')


@pytest.fixture
def budget_rt(make_runtime):
    rt = make_runtime(
        registry=fast_registry(),
        AIJOB_PRICE_TABLE=PRICES,
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
    rt.budgets.put('user', 'alice', 'month', Decimal('10'), 'wait')
    page = board.operator().get('/dashboard/usage')
    assert page.status == 200
    assert re.search(
        r'<td>user</td><td>alice</td><td>month</td>\s*<td>10.000000</td><td>1.250000</td>'
        r'<td>0.000000</td>\s*<td>8.750000</td><td>wait</td>',
        page.text,
    )
    rt.budgets.delete(AiBudget.get().id)
    assert 'No budget' in board.operator().get('/dashboard/usage').text


# ---------------------------------------------------------------- the create-time refusal
def test_a_create_whose_budget_is_spent_is_429_and_writes_nothing(budget_api):
    record_cost('user-a', '2')
    assert put(budget_api.admin, scope='user', subject='user-a', period='day', amount='2').json
    budget_api.runtime.budgets.forget()  # this process's cache; others see it within a second
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

    # A reservation counts too: a budget reserved up to its amount refuses.
    put(budget_api.admin, scope='user', subject='user-b', period='month', amount='0.2')
    guard_of(budget_api.runtime).before(a_call(running_job(budget_api.runtime, 'user-b')))
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
    budgets = budget_rt.budgets
    budgets.all()  # the list is read once, then trusted for a second
    statements = budget_rt.store.statement_count()
    budgets.check_creatable('user-a', 'synthetic')
    assert budget_rt.store.statement_count() == statements


# ---------------------------------------------------------------- the guard
def test_a_call_reserves_its_maximum_cost_and_settles_its_real_cost(budget_api):
    rt = budget_api.runtime
    put(budget_api.admin, scope='user', subject='user-a', period='day', amount='1')
    put(budget_api.admin, scope='global', period='month', amount='5')
    rt.budgets.forget()
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
    budget_rt.budgets.put('global', '', 'day', Decimal('1'), 'fail')
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


def second_call_refused(rt, scope, subject, period, on_exceeded, refusal):
    """Under a budget of 0.3, which one call's MAX_COST fits and two do not, the first call is
    let through and the second raises ``refusal``: returns that exception."""
    rt.budgets.put(scope, subject, period, Decimal('0.3'), on_exceeded)
    guard = guard_of(rt)
    guard.before(a_call(running_job(rt)))
    with pytest.raises(refusal) as refused:
        guard.before(a_call(running_job(rt)))
    return refused.value


def test_a_call_over_a_fail_budget_fails_the_job_without_retry(budget_rt):
    failure = second_call_refused(budget_rt, 'user', 'user-a', 'day', 'fail', BudgetExceededFailure)
    assert isinstance(failure, JobFailure) and failure.code == 'BUDGET_EXCEEDED'
    assert not failure.retryable and not failure.may_retry('retry', 0)
    assert 'daily user user-a budget' in failure.public_message
    assert AiBudgetReservation.select().count() == 1
    assert spend_of(AiBudget.get().id) == (0, MAX_COST)


def test_a_call_over_a_wait_budget_is_deferred_until_the_period_resets(budget_rt):
    deferred = second_call_refused(budget_rt, 'global', '', 'month', 'wait', JobDeferred)
    now = budget_rt.store.clock()
    assert deferred.reason == 'budget'
    assert abs(deferred.delay_s - (period_reset('month', now) - now).total_seconds()) < 5
    assert deferred.detail == {'budgetIds': [AiBudget.get().id]}


def test_wait_fails_all_the_same_when_the_call_alone_is_over_the_budget(budget_rt):
    budget_rt.budgets.put('global', '', 'day', Decimal('0.1'), 'wait')
    with pytest.raises(BudgetExceededFailure):
        guard_of(budget_rt).before(a_call(running_job(budget_rt)))


def test_a_call_that_is_not_made_gives_its_reservation_back(budget_rt):
    budget_rt.budgets.put('global', '', 'day', Decimal('1'), 'fail')
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


def test_the_maximum_cost_falls_back_on_the_rendered_prompt_and_the_price_table(budget_rt):
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
    estimated = estimate_tokens(prompts.render(request))
    assert estimated > 100
    expected = (Decimal(estimated) * 1 + 50 * 2) / 1000
    assert guard_of(budget_rt).max_cost_micros(call) == int(expected * 10**6)


# ---------------------------------------------------------------- exact under concurrency
def test_threads_racing_for_one_budget_reserve_exactly_what_fits(budget_rt):
    budget_rt.budgets.put('jobType', 'synthetic', 'day', Decimal('1.4'), 'fail')  # 7 calls
    guard = guard_of(budget_rt)
    jobs = [running_job(budget_rt, 'racer-%d' % i) for i in range(20)]

    results, errors = run_threads(20, lambda i: guard.before(a_call(jobs[i])), budget_rt.store)
    refused = [e for e in errors if e is not None]
    assert all(isinstance(e, BudgetExceededFailure) for e in refused), refused
    assert len(refused) == 13
    assert AiBudgetReservation.select().count() == 7
    assert spend_of(AiBudget.get().id) == (0, Decimal('1.4'))


# ---------------------------------------------------------------- the reaper
def test_the_reaper_releases_the_reservations_of_lost_locks_only(budget_rt):
    budget_rt.budgets.put('global', '', 'day', Decimal('10'), 'fail')
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
    budget_rt.budgets.put('global', '', 'day', MAX_COST, 'fail')  # one call at a time
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
        AIJOB_PROVIDER_BASE_URL=fake.base_url,
        AIJOB_PROVIDER_MODEL='m',
        AIJOB_PLATFORM_API_KEY=PROVIDER_SETTINGS['AIJOB_PLATFORM_API_KEY'],
        AIJOB_PRICE_TABLE='{"m": {"prompt": "1", "completion": "1", "per": 1}}',
        AIJOB_BUDGET_MAX_TOKENS='20',
        **FAST_SETTINGS,
    )
    with rt.store.connection():
        rt.start_background()
        yield rt
        rt.stop_background(timeout_s=5)


def estimated_prompt_tokens(rt, job_type, input):
    """What the guard estimates for the first call of such a job (its rendered messages)."""
    request = SimpleNamespace(
        job_type=job_type,
        prompt_version=None,
        input=input,
        definition=rt.registry.get(job_type),
        attempt=1,
    )
    return estimate_tokens(rt.ai.prompts.render(request))


def test_jobs_through_the_engine_spend_at_most_their_budget(ai_budget_rt, fake):
    rt = ai_budget_rt
    prompt = estimated_prompt_tokens(rt, 'flashcard_generation', CARD_INPUT)
    # Each call answers with its maximum: the estimated prompt and all 20 completion tokens.
    fake.script(json_reply(CARDS, usage={'prompt_tokens': prompt, 'completion_tokens': 20}))
    max_cost = Decimal(prompt + 20)
    rt.budgets.put('user', 'user-a', 'day', 3 * max_cost, 'fail')
    # Every create goes in, whatever the calls already reserved: the calls are what is counted
    # here (the refusal at create is tested above).
    rt.service.budget_check = None
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
