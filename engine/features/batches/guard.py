"""The BatchGuard: a call of a job that may wait for a provider batch is parked (an item row and a
deferral) instead of sent, and answered from its line once the batch has it.

It stands after the budgets (a parked call holds its budget reservation until its line is used)
and before the rate limits (a batch takes no slot of the online limits). ``before`` looks for the
call's item (custom_id ``<job id>:<call no>``):

- none: the item is written with the exact body the online call would send, and the job is
  deferred for longer than the batch's 24 h window (if the batch machinery never answers, the
  deferral's own wake-up sends the call online, as an expired line does);
- waiting or batched (woken before its line): deferred again; once parked longer than the park's
  deferral (25 h), the item expires and the call goes online;
- answered: the line's completion, judged as the online call judges one, at the batch price;
- failed: the failure the online call would have had, for the job's retry policy to decide;
- expired, or its batch ended at the provider: the call goes online.

A job woken on another entry of its route (its batch's entry cooling) still finds its item: an
answer paid for is used. ``settle`` marks the item consumed in the transaction of the call's usage
row, unless the attempt lost its lock: an answer is used once, by the attempt that projects it."""

import contextlib

from ...core.errors import JobDeferred, ProviderError
from ...core.registry import BATCH_QUEUE
from ...execution.attempt import LOCK_LOST
from ...execution.providers import CallGuard, Usage
from ..gateway.openai_client import OpenAICompatibleProvider, parse_completion, status_failure
from ..gateway.providers_config import Entry
from . import items
from .items import ANSWERED, BATCHED, EXPIRED, FAILED, PARKED, WAITING

# Beyond the 24 h completion window: the deferral's wake-up is the last resort of a parked job.
PARK_DELAY_S = 25 * 3600


class BatchGuard(CallGuard):
    NOTE = 'batch'

    def __init__(self, store, table):
        self.store = store
        self.table = table  # providers_config.ProvidersConfig: the entries' own BatchPolicy
        self._unit = store.connection if store.dialect == 'mysql' else contextlib.nullcontext

    def policy_for(self, call):
        """The call's BatchPolicy (its route entry's, else its definition's), or None when the
        call goes online: not on ai-background, a user's own key, or no OpenAI-compatible
        provider behind it."""
        if call.job.queue_name != BATCH_QUEUE or call.request.credential.mode != 'platform_key':
            return None
        if not isinstance(call.provider, OpenAICompatibleProvider):
            return None
        entry = Entry(call.provider_key, call.model)
        spec = self.table.model(entry) if entry.provider in self.table.providers else None
        own = spec.batch if spec is not None else None
        return own or getattr(call.definition, 'batch', None)

    def before(self, call):
        policy = self.policy_for(call)
        if policy is None and not call.job.defer_count:
            return None  # never deferred, so never parked: no line of a batch is its
        with self._unit():
            item = self._item(call, policy)
        if item is None:
            return None
        call.notes[self.NOTE] = item.id
        return self._outcome(item)

    def _item(self, call, policy):
        """The call's item once it has its outcome, None when it has none and needs none;
        raises the park's deferral before then. A call parked under one route entry keeps its
        item when it wakes on another (its entry cooling): an answer paid for is used."""
        item = items.find(items.custom_id(call.job.id, call.call_no))
        if item is None:
            if policy is None:
                return None
            body = call.provider.chat_body(call.request)
            self.store.run_in_transaction(lambda tx: items.park(self.store, call, policy, body))
            raise _parked(None)
        if item.state in (WAITING, BATCHED):
            if self._overdue(item):  # the last resort: no line came within the window
                items.set_outcome(self.store, item.id, EXPIRED, from_states=(WAITING, BATCHED))
            elif items.repark(item.id, call.job.attempt_no):
                raise _parked(item.batch_id)
            item = items.find(item.custom_id)  # its outcome came meanwhile, or it expired
        return item

    def _overdue(self, item):
        """Parked longer than the park's own deferral: the batch machinery never answered
        (a provider that never ends a batch, a batch stuck at the provider), so the call goes
        online rather than wait forever; the poller's compare-and-set then ignores a late line."""
        age = self.store.clock() - item.created_at
        return age.total_seconds() >= PARK_DELAY_S

    def _outcome(self, item):
        if item.state == ANSWERED:
            try:
                result = parse_completion(item.response)
            except Exception as exc:  # a refusal or no JSON: the online call's failure
                exc.usage = _billed(getattr(exc, 'usage', None) or Usage(), item.batch_id)
                raise
            result.usage = _billed(result.usage, item.batch_id)
            return result
        if item.state == FAILED:
            failure = line_failure(item.response, item.error_code)
            failure.usage = _billed(Usage(), item.batch_id)
            raise failure
        # expired, cancelled at the provider (EXPIRED, CANCELLED), or CONSUMED by an attempt
        # that died before its next call was counted: the call goes online
        return None

    def settle(self, call, usage, cost, error_code):
        item_id = call.notes.get(self.NOTE)
        # An attempt that lost its lock projects nothing: its answer stays for the next one.
        if item_id is not None and error_code != LOCK_LOST:
            items.consume(item_id)


def _parked(batch_id):
    detail = {'batchId': batch_id} if batch_id else {}
    return JobDeferred(PARK_DELAY_S, PARKED, detail, call_out=True)


def _billed(usage, batch_id):
    usage.batch = True
    usage.batch_id = batch_id
    return usage


def line_failure(response, error_code):
    """The JobFailure of a failed line: an HTTP status with its error body, as the online call
    classifies it, or a line the provider could not run at all (a retryable provider error)."""
    response = response or {}
    status = response.get('status_code')
    if isinstance(status, int):
        error = ((response.get('body') or {}).get('error')) or {}
        message = str(error.get('message') or '')
        return status_failure(status, message, error.get('code'), error_type=error.get('type'))
    return ProviderError('batch line failed: %s' % (error_code or 'unknown'), code='PROVIDER_ERROR')
