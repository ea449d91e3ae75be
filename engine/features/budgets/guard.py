"""The BudgetGuard: each provider call's maximum cost reserved before it, settled with its usage
row (the ledger: ledger.py)."""

from ...core.errors import BudgetExceededFailure, JobDeferred, JobFailure
from ...execution.providers import CallGuard
from ...execution.usage import max_call_cost
from ..gateway.openai_client import prompt_measures
from .ledger import Exceeded, InFlight, from_micros, refusal_message, to_micros


class BudgetGuard(CallGuard):
    """Reserves each call's maximum cost before it (or fails the job BUDGET_EXCEEDED, or defers
    it when every budget it would pass says ``wait``, or while calls in flight hold the room it
    needs), settles the reservation with the call's usage row, and releases it when the call
    was not made."""

    NOTE = 'budgets'

    def __init__(self, budgets, pricing, max_tokens):
        self.budgets = budgets
        self.pricing = pricing
        self.max_tokens = max_tokens  # for calls whose route entry sets no max_tokens

    def before(self, call):
        job = call.job
        if not self.budgets.applicable(job.user_id, job.job_type):
            return None
        max_micros = self.max_cost_micros(call)
        if not max_micros:  # a call with no price spends nothing: there is nothing to hold
            return None
        outcome = self.budgets.reserve(job, call.call_no, max_micros)
        if isinstance(outcome, Exceeded):
            raise self._refusal(outcome)
        if isinstance(outcome, InFlight):
            detail = {'budgetIds': [b.id for b in outcome.budgets], 'inFlight': True}
            raise JobDeferred(outcome.wait_s(job.defer_count or 0), 'budget', detail)
        if outcome is not None:
            call.notes[self.NOTE] = outcome
        return None

    def after(self, call, usage, failure):
        # A JobFailure (or a success) gets its usage row, which settles the reservation; a
        # deferral or a route entry found unavailable gets none: give the reservation back.
        reservation = call.notes.get(self.NOTE)
        if reservation is None or failure is None or isinstance(failure, JobFailure):
            return
        if isinstance(failure, JobDeferred) and failure.call_out:
            # Handed on (parked in a provider batch): the reservation covers the call until its
            # answer is used (the next lock's reserve, or the reaper once the job ends, gives
            # it back).
            return
        self.budgets.release(reservation)

    def settle(self, call, usage, cost, error_code):
        reservation = call.notes.get(self.NOTE)
        if reservation is not None:
            self.budgets.settle(reservation, cost)

    def max_cost_micros(self, call):
        """The most the call can cost: its prompt's token bound at the prompt price plus its
        max_tokens at the completion price (a provider without templates: the prompt tokens
        its gateway estimated)."""
        prompt_tokens = call.prompt_token_bound  # the routed gateway's, from its one rendering
        if prompt_tokens is None:
            prompt_tokens = prompt_measures(call.provider, call.request)[1]
        if prompt_tokens is None:
            prompt_tokens = call.prompt_tokens
        completion_tokens = call.max_tokens or self.max_tokens
        price = call.price
        if price is None:  # a call no route entry priced: the provider config's, if any
            price = self.pricing.price(call.provider_key, call.model)
        return to_micros(max_call_cost(price, prompt_tokens, completion_tokens))

    def _refusal(self, exceeded):
        first = exceeded.budgets[0]
        if exceeded.must_fail():
            message = 'budget %s exceeded: reserving %s would pass %s' % (
                first.id,
                from_micros(exceeded.max_micros),
                first.describe(),
            )
            return BudgetExceededFailure(
                message, public_message=refusal_message(first, exceeded.now)
            )
        return JobDeferred(
            exceeded.wait_s(), 'budget', {'budgetIds': [b.id for b in exceeded.budgets]}
        )
