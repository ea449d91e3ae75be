"""The one step of provider batches that the housekeeping leader runs every AIJOB_BATCH_INTERVAL_MS
(the runtime hands it to the worker; one leader, so one batcher across every process): form the
due batches, upload and create the pending ones, cancel those whose jobs were all cancelled,
poll the due ones and write their results, and wake any job whose line has its outcome.

``BatchesExtension`` puts the BatchGuard among the call guards (after the budgets, before the
rate limits) and the runner's step among the leader's, when a definition or a route entry opts
in."""

import logging

from ...core.logs import log_event
from . import items
from .api import BatchApi, BatchApiError
from .batcher import BUILDING, UPLOADED, Batcher
from .poller import Poller

__all__ = ('BatchRunner',)


class BatchRunner:
    def __init__(self, store, outbox, table, pricing, config, budgets=None, api_factory=BatchApi):
        self.store = store
        self.outbox = outbox
        self.table = table
        self._api_factory = api_factory
        self._apis = {}
        self.batcher = Batcher(store, self.api, config.batch_poll_first_ms)
        self.poller = Poller(
            store,
            outbox,
            self.api,
            pricing,
            config.batch_poll_first_ms,
            config.batch_poll_max_ms,
            config.batch_result_chunk,
            budgets,
        )

    def api(self, provider):
        """The BatchApi of a provider of AIJOB_PROVIDERS (its base URL and key), made once."""
        api = self._apis.get(provider)
        if api is None:
            spec = self.table.providers[provider]
            api = self._apis[provider] = self._api_factory(
                spec.base_url, self.table.key_of(provider)
            )
        return api

    def step(self, leading=None):
        """One turn of every stage, each batch on its own: a batch whose step failed is tried
        again after a backoff (a retryable provider error, or anything unexpected) or sent
        online (refused for good, or its provider is no longer configured), and the other
        batches go on. ``leading()``: does this process still hold the housekeeping lease?
        Asked before each batch's provider calls, and again right before an upload or a
        create, so a step that outlives its lease stops instead of racing the next leader."""
        leading = leading or (lambda: True)
        self.batcher.form()
        for batch in self.batcher.pending():
            if not leading():
                return
            self._guarded('submit', batch, lambda b=batch: self._submit(b, leading))
        for batch in self.poller.abandoned():
            if not leading():
                return
            self._guarded('cancel', batch, lambda b=batch: self.poller.cancel(b))
        for batch in self.poller.due():
            if not leading():
                return
            self._guarded('poll', batch, lambda b=batch: self.poller.poll(b))
        self.store.run_in_transaction(lambda tx: items.wake(self.store, self.outbox, tx))

    def _submit(self, batch, leading):
        if self.batcher.all_jobs_ended(batch):  # nothing left to ask the provider for
            log_event('batch.dropped', batch_id=batch.id)
            self.poller.abandon(batch)
            return
        if batch.state == BUILDING:
            self.batcher.upload(batch, leading)
        if batch.state == UPLOADED:
            self.batcher.create(batch, leading)

    def _guarded(self, step, batch, work):
        """``work()`` for one batch; whatever it raises stays with that batch."""
        if batch.provider not in self.table.providers:
            log_event(
                'batch.abandoned',
                logging.WARNING,
                batch_id=batch.id,
                step=step,
                reason='provider not configured',
            )
            self.poller.abandon(batch)
            return
        try:
            work()
        except BatchApiError as exc:
            log_event(
                'batch.step_failed',
                logging.WARNING,
                step=step,
                batch_id=batch.id,
                error=str(exc)[:300],
                retryable=exc.retryable,
            )
            if exc.retryable:
                self.poller.later(batch)
            else:
                log_event('batch.abandoned', batch_id=batch.id, step=step)
                self.poller.abandon(batch)
        except Exception as exc:  # a bug or a malformed answer: this batch waits, the rest go on
            # The class only: a message may quote a line of the batch (job input or output).
            log_event(
                'batch.step_failed',
                logging.ERROR,
                step=step,
                batch_id=batch.id,
                error=exc.__class__.__name__,
                retryable=True,
            )
            self.poller.later(batch)


def opted_in(registry, table):
    """Does any definition, or any model of the provider file, opt in to batches?"""
    if any(getattr(d, 'batch', None) is not None for d in registry.get_all()):
        return True
    return any(m.batch is not None for p in table.providers.values() for m in p.models.values())
