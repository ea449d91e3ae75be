"""Budgets in money across real worker processes (issues 21 and 31), on MariaDB + Redis:
50 concurrent jobs over 3 workers against a budget that fits exactly 10 calls at their maximum
cost make at most 10 provider calls, record no more than the budget and fail the others
BUDGET_EXCEEDED; a worker ``kill -9``-ed between reserve and settle leaks nothing once the
reaper has run. Issue 31's four cases (tests/support/budget_cases.py), 50 jobs over 2 workers:
Chinese input a tokenizer counts at 3x characters ÷ 4, a provider counting more prompt tokens
than that, one that would write 8 000 tokens, and calls that cost a tenth of their maximum."""

import time
from collections import Counter
from dataclasses import replace
from decimal import Decimal

import pytest

from engine.core.models import AiJob, AiUsageLog
from engine.core.states import TERMINAL
from engine.features.budgets.ledger import CACHE_S
from engine.features.budgets.models import AiBudget, AiBudgetReservation, AiBudgetSpend
from tests.support import budget_cases
from tests.support.backends import require_servers
from tests.support.fake_openai import json_reply
from tests.support.helpers import create_job, wait_until
from tests.support.provider_configs import one_provider
from tests.support.runtimes import FAST_SETTINGS, PROVIDER_SETTINGS

pytestmark = pytest.mark.slow

CARDS = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}]}
CARD_INPUT = {'text': 'Paris is the capital of France.', 'maxCards': 1}
MAX_TOKENS = budget_cases.MAX_TOKENS


@pytest.fixture
def shared(make_runtime, backend, fake):
    if backend.name != 'mysql+redis':
        pytest.skip('worker processes share a queue through Redis')
    require_servers('mysql', 'redis')
    settings = dict(
        FAST_SETTINGS,
        AIJOB_PLATFORM_API_KEY=PROVIDER_SETTINGS['AIJOB_PLATFORM_API_KEY'],
        # One token costs 1: a call's cost is its token count.
        **one_provider(fake.base_url, model='m', price=budget_cases.PRICE),
        AIJOB_BUDGET_MAX_TOKENS=str(MAX_TOKENS),
        AIJOB_INTERACTIVE_CONCURRENCY='4',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )
    rt = make_runtime(**settings)
    rt.env = backend.env(**settings)
    # The test creates every job whatever the budgets say: the refusal at create is
    # tests/features/budgets/test_budgets.py's; here the calls are what is counted.
    rt.service.create_checks = ()
    with rt.store.connection():
        yield rt


def max_cost(rt):
    """A flashcard call's maximum cost as the workers reserve it (prices of 1 per token)."""
    return budget_cases.max_cost(rt, CARD_INPUT)


def answer_at_max_cost(fake, prompt_tokens, **kw):
    """Every call reports its maximum: nothing a call leaves unspent lets another one in."""
    usage = {'prompt_tokens': prompt_tokens, 'completion_tokens': MAX_TOKENS}
    fake.script(json_reply(CARDS, usage=usage, **kw))


def jobs_of(user_id, count, rt, input=CARD_INPUT):
    return [
        create_job(rt, job_type='flashcard_generation', user_id=user_id, input=input)
        for _ in range(count)
    ]


def all_terminal(jobs, timeout):
    ids = [job.id for job in jobs]

    def done():
        rows = list(AiJob.select().where(AiJob.id.in_(ids)))
        return rows if all(row.lifecycle_status in TERMINAL for row in rows) else None

    return wait_until(done, timeout=timeout, interval=0.1)


def spend(budget):
    row = AiBudgetSpend.get(AiBudgetSpend.budget_id == budget.id)
    return Decimal(row.spent_micros) / 10**6, Decimal(row.reserved_micros) / 10**6


def recorded_cost(user_id):
    rows = AiUsageLog.select().where(AiUsageLog.user_id == user_id)
    return sum((row.cost for row in rows), Decimal(0))


def test_fifty_jobs_on_three_workers_spend_at_most_their_budget_and_a_kill_leaks_nothing(
    shared, fake, spawn
):
    rt = shared
    cost = max_cost(rt)
    answer_at_max_cost(fake, cost - MAX_TOKENS, first_delay_s=0.2)
    budget, _ = rt.features['budgets'].put('user', 'spender', 'day', Decimal(10 * cost), 'fail')
    workers = [spawn(rt.env) for _ in range(3)]

    jobs = jobs_of('spender', 50, rt)
    finished = all_terminal(jobs, timeout=40)
    succeeded = [job for job in finished if job.lifecycle_status == 'succeeded']
    refused = [job for job in finished if job.lifecycle_status != 'succeeded']
    calls = len(fake.requests)
    print(
        'budget for 10 calls of %d: %d provider calls, %d succeeded, %d BUDGET_EXCEEDED, '
        'spent %s of %s' % (cost, calls, len(succeeded), len(refused), spend(budget)[0], 10 * cost)
    )
    rows = AiUsageLog.select().where(AiUsageLog.user_id == 'spender')
    print('usage rows:', Counter((r.error_code, r.attempt_no, str(r.cost)) for r in rows))
    assert calls <= 10 and len(succeeded) == calls
    assert {(job.lifecycle_status, job.error_code) for job in refused} == {
        ('failed', 'BUDGET_EXCEEDED')
    }
    assert recorded_cost('spender') <= 10 * cost
    assert spend(budget) == (recorded_cost('spender'), 0)
    assert AiBudgetReservation.select().count() == 0
    ran_on = [len(worker.events('job.finished')) for worker in workers]
    assert sum(1 for n in ran_on if n) >= 2, ran_on  # the workers raced each other

    # kill -9 a worker in the middle of its calls: their reservations outlive it until the
    # reaper (the leader's, whichever survives) finds the job's lock gone.
    answer_at_max_cost(fake, cost - MAX_TOKENS, first_delay_s=3.0)
    victim_budget, _ = rt.features['budgets'].put(
        'user', 'victim', 'day', Decimal(4 * cost), 'fail'
    )
    time.sleep(CACHE_S + 0.2)  # a new budget holds in every process within CACHE_S
    held = jobs_of('victim', 4, rt)
    wait_until(
        lambda: (
            AiBudgetReservation.select()
            .where(AiBudgetReservation.job_id.in_([j.id for j in held]))
            .count()
            == 4
        ),
        timeout=20,
    )
    owner = AiJob.get_by_id(held[0].id)
    [victim] = [w for w in workers if w.owns(owner)]
    victim.kill()
    killed = [j for j in held if victim.owns(AiJob.get_by_id(j.id))]
    answer_at_max_cost(fake, cost - MAX_TOKENS)

    finished = all_terminal(held, timeout=40)
    assert AiBudgetReservation.select().count() == 0
    spent, reserved = spend(victim_budget)
    print(
        'kill -9 with %d reservations held: %s; spent %s, reserved %s after the reaper'
        % (
            len(killed),
            [(j.lifecycle_status, j.error_code, j.attempt_no) for j in finished],
            spent,
            reserved,
        )
    )
    assert reserved == 0 and spent == recorded_cost('victim') <= 4 * cost
    # Released by the reaper, or by the worker that took a job over first (its next attempt).
    released = sum(e['count'] for w in workers for e in w.events('reaper.reservations_released'))
    assert len(killed) >= 1 and released <= len(killed)
    # The reservations of the dead worker went back: the jobs it held ran again and fit.
    assert all(job.lifecycle_status == 'succeeded' for job in finished)
    assert AiBudget.select().count() == 2


@pytest.mark.parametrize('case', sorted(budget_cases.CASES))
def test_fifty_jobs_on_two_workers_spend_at_most_their_budget_and_none_is_refused_with_room(
    shared, fake, spawn, case
):
    rt = shared
    input, reply = budget_cases.CASES[case]
    fake.script(replace(reply, first_delay_s=0.1))
    cost = budget_cases.max_cost(rt, input)
    budget, _ = rt.features['budgets'].put(
        'user', 'fifty', 'day', Decimal(budget_cases.BUDGET_CALLS * cost), 'fail'
    )
    workers = [spawn(rt.env) for _ in range(2)]

    jobs = jobs_of('fifty', budget_cases.JOBS, rt, input)
    all_terminal(jobs, timeout=180)
    run = budget_cases.outcome(budget, 'fifty', [job.id for job in jobs], cost, fake)
    print(budget_cases.check(case, run))
    ran_on = [len(worker.events('job.finished')) for worker in workers]
    assert all(ran_on), ran_on  # both workers took jobs
