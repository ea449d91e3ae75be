"""The four budget cases of issue 31, for 50 concurrent jobs against a budget of 10 calls'
worth, in one process (tests/features/budgets/test_budgets.py, both backend pairs) and over two
worker processes (tests/features/budgets/test_budget_processes.py): what the fake provider
answers in each, the maximum cost the workers reserve for a call, and what a finished run must show.

Prices are 1 per token, so a call's cost is its token count and a budget is counted in tokens.
"""

from decimal import Decimal
from types import SimpleNamespace

from engine.core.history import DEFERRED
from engine.core.models import AiJob, AiJobEvent, AiUsageLog
from engine.features.budgets.models import AiBudgetReservation, AiBudgetSpend
from engine.features.gateway.openai_client import prompt_token_bound
from tests.support.fake_openai import json_reply

MAX_TOKENS = 20  # AIJOB_BUDGET_MAX_TOKENS: the shorthand's entry sets no maxTokens
PRICE = {'prompt': '1', 'completion': '1', 'per': 1}  # model m's, in AIJOB_PROVIDERS
JOBS = 50
BUDGET_CALLS = 10
CARDS = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}]}
ENGLISH = {'text': 'Paris is the capital of France. ' * 8, 'maxCards': 1}
CHINESE = {
    'text': '巴黎是法国的首都，位于塞纳河畔，是欧洲最重要的文化中心之一。' * 8,
    'maxCards': 1,
}


def chars_over_4(messages):
    """The prompt estimate of before issue 31: characters ÷ 4."""
    return sum(len(m['content']) for m in messages) // 4


def one_per_byte(messages):
    """The most a byte-level tokenizer can count for the text alone: a token per byte."""
    return sum(len(m['content'].encode('utf-8')) for m in messages)


def a_tenth_of_the_bound(messages):
    return prompt_token_bound(messages) // 10


# name: (input, reply). Every reply but the last costs about what the call reserved.
CASES = {
    # A real tokenizer counts Chinese at 3x what characters ÷ 4 guessed.
    'chinese': (
        CHINESE,
        json_reply(
            CARDS, prompt_tokens=lambda m: 3 * chars_over_4(m), completion_tokens=MAX_TOKENS
        ),
    ),
    # A provider counting more prompt tokens than characters ÷ 4: one per byte, the most.
    'more_prompt_tokens': (
        ENGLISH,
        json_reply(CARDS, prompt_tokens=one_per_byte, completion_tokens=MAX_TOKENS),
    ),
    # No maxTokens on the entry, a provider that would write 8 000 tokens: max_tokens cuts it.
    'would_write_8000': (
        ENGLISH,
        json_reply(CARDS, prompt_tokens=chars_over_4, completion_tokens=8000),
    ),
    # Calls that really cost a tenth of their maximum: every job must run.
    'a_tenth': (
        ENGLISH,
        json_reply(CARDS, prompt_tokens=a_tenth_of_the_bound, completion_tokens=MAX_TOKENS // 10),
    ),
}


def max_cost(rt, input):
    """A flashcard call's maximum cost as the workers reserve it: the prompt's bound and
    MAX_TOKENS, at 1 per token."""
    request = SimpleNamespace(
        job_type='flashcard_generation',
        prompt_version=None,
        input=input,
        definition=rt.registry.get('flashcard_generation'),
        attempt=1,
    )
    return prompt_token_bound(rt.ai.prompts.render(request)) + MAX_TOKENS


def outcome(budget, user_id, job_ids, cost, fake):
    """What a finished run shows: the jobs' outcomes, the spend recorded (usage rows) and
    counted (the budget's spend row), and what the requests carried."""
    jobs = list(AiJob.select().where(AiJob.id.in_(job_ids)))
    spend = AiBudgetSpend.get(AiBudgetSpend.budget_id == budget.id)
    rows = AiUsageLog.select().where(AiUsageLog.user_id == user_id)
    deferrals = AiJobEvent.select().where(
        AiJobEvent.job_id.in_(job_ids) & (AiJobEvent.kind == DEFERRED)
    )
    return SimpleNamespace(
        succeeded=sum(1 for j in jobs if j.lifecycle_status == 'succeeded'),
        refused=sorted(
            (j.lifecycle_status, j.error_code) for j in jobs if j.lifecycle_status != 'succeeded'
        ),
        recorded=sum((row.cost for row in rows), Decimal(0)),
        spent=Decimal(spend.spent_micros) / 10**6,
        reserved=Decimal(spend.reserved_micros) / 10**6,
        reservations=AiBudgetReservation.select().count(),
        amount=Decimal(BUDGET_CALLS * cost),
        cost=cost,
        calls=len(fake.requests),
        max_tokens_sent={r.get('max_tokens') for r in fake.requests},
        waits=sum(1 for e in deferrals if e.detail.get('inFlight')),
    )


def check(name, run):
    """The promises of issue 31 for a finished run of case ``name``; returns the line that
    reports its figures."""
    report = (
        '%s: %d calls, %d succeeded, %d BUDGET_EXCEEDED, spent %s of %s (%.0f %%), '
        '%d waits for calls in flight'
        % (
            name,
            run.calls,
            run.succeeded,
            len(run.refused),
            run.spent,
            run.amount,
            100 * run.spent / run.amount,
            run.waits,
        )
    )
    # Spend bounded: what the usage rows recorded never passes the budget.
    assert run.recorded <= run.amount, report
    assert (run.spent, run.reserved, run.reservations) == (run.recorded, 0, 0), report
    # Each call sent the completion tokens it reserved.
    assert run.max_tokens_sent == {MAX_TOKENS}, report
    # No refusal while room is left: a job fails only once the spend leaves no room for a call.
    assert set(run.refused) <= {('failed', 'BUDGET_EXCEEDED')}, report
    assert run.succeeded >= BUDGET_CALLS, report
    if run.refused:
        assert run.spent + run.cost > run.amount, report
    if name == 'a_tenth':
        assert run.succeeded == JOBS, report
    return report
