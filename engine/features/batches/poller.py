"""Polling submitted provider batches and writing their results: each open batch is asked for its
status with a backoff (a few seconds at first, doubling up to minutes); once it is over
(completed, expired, cancelled, failed) its output and error files are read and each line's
outcome is written into its item, a bounded chunk of lines per transaction with the wake-up of
their jobs. A re-run after a kill writes only the items still ``batched``: a line's outcome is
written once. A submitted batch whose every job was cancelled is cancelled at the provider."""

from decimal import Decimal
from types import SimpleNamespace

from peewee import SQL, fn

from ...core.logs import log_event
from ...core.models import AiJob
from ...execution.usage import record_usage
from ..gateway.openai_client import completion_usage
from . import items
from .batcher import CANCELLING, ENDED, SUBMITTED, TERMINAL
from .items import ANSWERED, BATCHED, CANCELLED, EXPIRED, FAILED
from .models import AiProviderBatch, AiProviderBatchItem

OVER = ('completed', 'expired', 'cancelled', 'failed')  # the provider is done with the batch
# A line the provider never ran: the call goes online.
NOT_RUN = ('batch_expired', 'batch_cancelled')
CANCELLED_CODE = 'CANCELLED'  # the usage row of a billed line whose job was cancelled
MAX_CODE = 64  # ai_provider_batch_item.error_code


def line_outcome(line, provider_status):
    """(state, response, error_code) of an item from its ``line`` (None: the provider wrote
    none for it) in a batch that ended ``provider_status``."""
    if line is None:
        if provider_status == 'completed':
            return FAILED, {'error': {'code': 'missing_line'}}, 'missing_line'
        return EXPIRED, None, None
    response = line.get('response')
    if isinstance(response, dict) and response.get('status_code') is not None:
        status, body = response['status_code'], response.get('body') or {}
        if not isinstance(body, dict):  # not the documented line: retried like a missing one
            return FAILED, {'error': {'code': 'malformed_line'}}, 'malformed_line'
        if status == 200:
            return ANSWERED, body, None
        code = ((body.get('error') or {}).get('code')) or 'http_%s' % status
        return FAILED, {'status_code': status, 'body': body}, str(code)[:MAX_CODE]
    error = line.get('error')
    error = error if isinstance(error, dict) else {}
    code = str(error.get('code') or 'line_error')[:MAX_CODE]
    if code in NOT_RUN:
        return EXPIRED, None, None
    return FAILED, {'error': error}, code


def _batch_usage(body):
    """The Usage of an answered line, priced as a batch call: the online path's reading."""
    raw = (body or {}).get('usage')
    usage = completion_usage(raw if isinstance(raw, dict) else {})
    usage.batch = True
    return usage


class Poller:
    def __init__(self, store, outbox, apis, pricing, poll_first_ms, poll_max_ms, chunk, budgets):
        self.store = store
        self.outbox = outbox
        self.apis = apis  # apis(provider name) -> its BatchApi
        self.pricing = pricing
        self.poll_first_ms = poll_first_ms
        self.poll_max_ms = poll_max_ms
        self.chunk = chunk
        self.budgets = budgets  # the ledger of engine/features/budgets/ledger.py, or None

    def due(self):
        """The open batches whose next poll has come."""
        return list(
            AiProviderBatch.select()
            .where(AiProviderBatch.state.in_((SUBMITTED, CANCELLING)))
            .where(AiProviderBatch.next_poll_at <= self.store.now())
            .order_by(AiProviderBatch.next_poll_at)
        )

    def poll(self, batch):
        """Ask the provider; write the results once the batch is over, else wait longer."""
        info = self.apis(batch.provider).retrieve(batch.provider_batch_id)
        if info['status'] in OVER:
            self.results(batch, info)
            return
        self.later(batch, provider_status=info['status'])

    def results(self, batch, info):
        """Every line's outcome into its item, ``chunk`` items per transaction, then the row
        ended with its counts and cost."""
        api = self.apis(batch.provider)
        lines = {}
        for file_id in (info.get('output_file_id'), info.get('error_file_id')):
            if file_id:
                lines.update((line.get('custom_id'), line) for line in api.lines(file_id))
        AiProviderBatch.update(
            provider_status=info['status'],
            output_file_id=info.get('output_file_id'),
            error_file_id=info.get('error_file_id'),
            updated_at=self.store.now(),
        ).where(AiProviderBatch.id == batch.id).execute()
        status = info['status']
        self.write_outcomes(batch, lambda item: line_outcome(lines.get(item.custom_id), status))
        self.end(batch)

    def write_outcomes(self, batch, outcome_of):
        """``outcome_of(item)`` into each item still batched, ``chunk`` per transaction with
        the wake-up of their jobs; an item whose job has ended is cancelled (its line ignored)."""
        while True:
            pending = list(
                AiProviderBatchItem.select(
                    AiProviderBatchItem,
                    AiJob.lifecycle_status,
                    AiJob.user_id,
                    AiJob.job_type,
                    AiJob.attempt_no.alias('job_attempt_no'),
                    AiJob.credential_mode,
                )
                .join(AiJob, on=(AiJob.id == AiProviderBatchItem.job_id))
                .where(
                    (AiProviderBatchItem.batch_id == batch.id)
                    & (AiProviderBatchItem.state == BATCHED)
                )
                .order_by(AiProviderBatchItem.id)
                .limit(self.chunk)
                .objects()
            )
            if not pending:
                return
            self.store.run_in_transaction(
                lambda tx, p=pending: self._write_chunk(tx, batch, p, outcome_of)
            )

    def _write_chunk(self, tx, batch, pending, outcome_of):
        woken = []
        for item in pending:
            state, response, error_code = outcome_of(item)
            if item.lifecycle_status in TERMINAL:
                self._ignore(batch, item, state, response)
                continue
            if items.set_outcome(self.store, item.id, state, response, error_code):
                woken.append(item.job_id)
        items.wake(self.store, self.outbox, tx, woken)

    def _ignore(self, batch, item, state, response):
        """The line of a job that has ended (cancelled) is not used; an answered one was billed
        all the same, so it keeps its response (the batch row's cost counts it), its cost at
        the batch price is spent against the job's budgets, and a usage row (CANCELLED, the
        batch id) records it."""
        if state != ANSWERED:
            items.set_outcome(self.store, item.id, CANCELLED)
            return
        if not items.set_outcome(self.store, item.id, CANCELLED, response):
            return  # written already by an earlier run
        usage = _batch_usage(response)
        usage.batch_id = batch.id
        cost = self.pricing.cost(batch.provider, batch.model, usage)
        if self.budgets is not None:
            self.budgets.add_spend(item.user_id, item.job_type, cost)
        job = SimpleNamespace(
            id=item.job_id,
            user_id=item.user_id,
            job_type=item.job_type,
            attempt_no=item.job_attempt_no,
            credential_mode=item.credential_mode,
        )
        record_usage(
            job, item.attempt_no, batch.provider, batch.model, usage, cost, 0, CANCELLED_CODE
        )

    def end(self, batch):
        """The row ended: lines answered, the others, and the cost of the answered lines at the
        batch price (what the provider bills, whether or not a job used its answer)."""
        answered = list(
            AiProviderBatchItem.select(AiProviderBatchItem.response).where(
                (AiProviderBatchItem.batch_id == batch.id)
                & AiProviderBatchItem.error_code.is_null()
                & AiProviderBatchItem.response.is_null(False)
            )
        )
        cost = sum((self._cost(batch, item.response) for item in answered), Decimal(0))
        changed = (
            AiProviderBatch.update(
                state=ENDED,
                succeeded_count=len(answered),
                failed_count=AiProviderBatch.job_count - len(answered),
                cost=cost,
                ended_at=self.store.now(),
                updated_at=self.store.now(),
            )
            .where((AiProviderBatch.id == batch.id) & (AiProviderBatch.state != ENDED))
            .execute()
        )
        if changed:
            log_event('batch.ended', batch_id=batch.id, answered=len(answered), cost=str(cost))

    def _cost(self, batch, body):
        return self.pricing.cost(batch.provider, batch.model, _batch_usage(body))

    # ---------------------------------------------------------------- cancel
    def abandoned(self):
        """The submitted batches none of whose jobs still wants its line (every one was
        cancelled), in one query."""
        item = AiProviderBatchItem.alias('i')
        job = AiJob.alias('j')
        alive = (
            item.select(SQL('1'))
            .join(job, on=(job.id == item.job_id))
            .where((item.batch_id == AiProviderBatch.id) & (job.lifecycle_status != 'cancelled'))
        )
        return list(
            AiProviderBatch.select()
            .where((AiProviderBatch.state == SUBMITTED) & ~fn.EXISTS(alive))
            .order_by(AiProviderBatch.created_at)
        )

    def cancel(self, batch):
        """Cancel a batch of ``abandoned()`` at the provider; its results are read as usual."""
        self.apis(batch.provider).cancel(batch.provider_batch_id)
        now = self.store.now()
        AiProviderBatch.update(state=CANCELLING, next_poll_at=now, updated_at=now).where(
            (AiProviderBatch.id == batch.id) & (AiProviderBatch.state == SUBMITTED)
        ).execute()
        log_event('batch.cancelled', batch_id=batch.id)

    def later(self, batch, **fields):
        """The batch's next turn waits the backoff (a few seconds, doubling to minutes): the
        provider is still at work, or a step failed and may succeed later (then the batch
        neither spins nor holds up the others). ``fields``: more columns to set."""
        wait_ms = min(self.poll_max_ms, self.poll_first_ms * 2 ** min(batch.poll_count + 1, 30))
        AiProviderBatch.update(
            **fields,
            poll_count=AiProviderBatch.poll_count + 1,
            next_poll_at=self.store.now_plus_ms(wait_ms),
            updated_at=self.store.now(),
        ).where(AiProviderBatch.id == batch.id).execute()

    def abandon(self, batch):
        """The provider refused a step for good: every job of the batch goes online (its items
        expired), and the row ends."""
        self.write_outcomes(batch, lambda item: (EXPIRED, None, None))
        self.end(batch)
