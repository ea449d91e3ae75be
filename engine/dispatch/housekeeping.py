"""The reaper and the reconciler: the loops that make sure no job stays ``running`` or ``queued``
forever, whatever happened to a worker or to Redis (architecture decisions 1 and 4); and the
purger, which keeps the snapshot and outbox tables from growing without bound."""

import logging
import time
from typing import NamedTuple

from ..core.errors import (
    IllegalTransitionError,
    InternalJobError,
    JobLockConflictError,
    QueueUnavailableError,
)
from ..core.fairness import user_key
from ..core.fences import ExpiredLockFence
from ..core.logs import log_event
from ..core.signals import SILENT
from .queue import Message


def message_for_job(job):
    return Message.for_job(
        job.id, job.job_type, job.queue_name, job.priority, user_key(job.user_id)
    )


class Reaper:
    """Running jobs whose lock expired ``reap_after_ms`` ago: finish a requested cancel, hand
    the job to another worker while its queue allows another attempt, else fail it
    INTERNAL_WORKER_LOST. A deferred job (no holder) past its wake time is pushed again,
    never counted lost. Also moves back the messages of consumers that stopped heartbeating.

    The database decides and the queue only carries the hand-over: during a queue outage the
    cancels and failures are still written, and the hand-overs wait for the queue's return (no
    worker could pop them meanwhile). A hand-over is pushed once; while its message waits for a
    free worker it is not pushed again until ``repush_after_ms`` has passed (the message may have
    been lost with Redis's data), as the reconciler does for queued jobs."""

    def __init__(
        self,
        lifecycle,
        queue,
        reap_after_ms=90_000,
        repush_after_ms=60_000,
        steps=(),
        signals=SILENT,
    ):
        self.lifecycle = lifecycle
        self.queue = queue
        self.reap_after_ms = reap_after_ms
        self.repush_after_s = repush_after_ms / 1000.0
        self._pushed = {}  # job id -> (attempt number, monotonic time of its hand-over push)
        # (name, step) for each: the extensions' releases, run first in each pass (the budget
        # reservations of calls whose worker died before settling them); step() returns how
        # many rows it released. The hook point reaper_steps of engine/core/extension.py.
        self.steps = steps
        self.signals = signals  # the jobs it finishes (core/signals.py)

    def sweep(self):
        """One pass; returns counts of messages recovered and jobs republished, waiting (pushed
        already, not yet taken), failed, cancelled, deferred (the queue is down) or skipped; and,
        what each of ``steps`` released, under its name."""
        counts = dict.fromkeys(
            ('recovered', 'republished', 'waiting', 'failed', 'cancelled', 'deferred', 'skipped'),
            0,
        )
        self._forget_old_pushes()
        queue_up = True
        try:
            counts['recovered'] = self.queue.recover_orphans()
        except QueueUnavailableError:
            queue_up = False
        for name, step in self.steps:
            # Before the hand-overs: the next attempt of a dead worker's job finds the budget
            # that worker's reservation held free again.
            counts[name] = step()  # the step logs what it released
        for job in self.lifecycle.find_expired_locks(self.reap_after_ms):
            outcome = self._reap(job, queue_up)
            queue_up = queue_up and outcome != 'deferred'
            counts[outcome] += 1
        if counts['deferred']:
            log_event('reaper.republish_deferred', logging.WARNING, count=counts['deferred'])
        return counts

    def _reap(self, job, queue_up):
        fence = ExpiredLockFence(job.attempt_no, self.reap_after_ms)
        try:
            if job.cancel_requested_at is not None:
                self.lifecycle.mark_cancelled(job.id, fence=fence)
                self.signals.job_finished(job.job_type, job.queue_name, 'cancelled')
                return 'cancelled'
            if job.locked_by is None:  # deferred (lifecycle.defer): waiting, nobody lost
                return self._wake(job) if queue_up else 'deferred'
            if self.lifecycle.attempts_left(job):
                return self._republish(job) if queue_up else 'deferred'
            self.lifecycle.mark_failed(
                job.id,
                InternalJobError(
                    'worker %s lost; %d attempts used' % (job.locked_by, job.attempt_no),
                    code='INTERNAL_WORKER_LOST',
                    public_message='The job was interrupted; please retry.',
                ),
                fence=fence,
            )
            self.signals.job_finished(job.job_type, job.queue_name, 'failed')
            log_event(
                'job.worker_lost',
                logging.WARNING,
                job_id=job.id,
                worker=job.locked_by,
                outcome='failed',
                attempts=job.attempt_no,
            )
            return 'failed'
        except (JobLockConflictError, IllegalTransitionError):
            return 'skipped'  # its worker heartbeated or finished meanwhile: keep it

    def _republish(self, job):
        """The dead worker's message may be gone (Redis lost it) or still held by a live but
        stuck process: push anyway; the lock CAS lets one worker take over."""
        if self._pushed.get(job.id, (None,))[0] == job.attempt_no:
            return 'waiting'
        self.lifecycle.record_worker_lost(job)  # before the push: it precedes the takeover
        try:
            self.queue.push(message_for_job(job), force=True)
        except QueueUnavailableError:
            return 'deferred'
        self._pushed[job.id] = (job.attempt_no, time.monotonic())
        log_event(
            'job.worker_lost',
            logging.WARNING,
            job_id=job.id,
            worker=job.locked_by,
            outcome='republished',
        )
        return 'republished'

    def _wake(self, job):
        """A deferred job whose wake time passed ``reap_after_ms`` ago and that no worker took
        (its wake-up message was lost with Redis's data): push it again, once per
        ``repush_after_ms``. No worker was lost, so no history row and no attempt counted."""
        if self._pushed.get(job.id, (None,))[0] == job.attempt_no:
            return 'waiting'
        try:
            self.queue.push(message_for_job(job), force=True)
        except QueueUnavailableError:
            return 'deferred'
        self._pushed[job.id] = (job.attempt_no, time.monotonic())
        log_event('job.wake_repushed', logging.WARNING, job_id=job.id)
        return 'republished'

    def _forget_old_pushes(self):
        oldest = time.monotonic() - self.repush_after_s
        self._pushed = {k: v for k, v in self._pushed.items() if v[1] > oldest}


class Reconciler:
    """Jobs ``queued`` longer than ``after_ms`` with no live queue entry are published again
    (a lost message, a Redis restart without persistence, a dead dispatcher)."""

    def __init__(self, lifecycle, queue, after_ms=60_000, batch_size=500):
        self.lifecycle = lifecycle
        self.queue = queue
        self.after_ms = after_ms
        self.batch_size = batch_size
        self._epoch = None

    def check_epoch(self):
        """Has the queue lost its data since the last look (its epoch changed)? Then every
        queued job without a live entry is published again now, not ``after_ms`` later.
        Returns how many were."""
        epoch = self.queue.epoch()
        lost, self._epoch = self._epoch is not None and epoch != self._epoch, epoch
        if not lost:
            return 0
        log_event('queue.data_lost', logging.WARNING)
        return self.sweep(after_ms=0)

    def sweep(self, after_ms=None):
        """One pass over jobs queued ``after_ms`` (default: the configured delay) with no live
        queue entry; returns how many were published again."""
        republished = []
        after_ms = self.after_ms if after_ms is None else after_ms
        for job in self.lifecycle.find_stale_queued(after_ms, self.batch_size):
            message = message_for_job(job)
            if not self.queue.has_entry(message):
                self.queue.push(message)
                republished.append(job.id)
        self.lifecycle.touch_queued(republished)
        if republished:
            log_event('reconciler.republished', logging.WARNING, count=len(republished))
        return len(republished)


class Purger:
    """Deletes what nobody needs any more, in batches so no statement holds locks for long: the
    input snapshots of finished jobs past their ``expires_at`` (contracts §8.4), outbox events
    published or dead longer than ``retention.outbox_ms`` ago, and the history rows of jobs
    finished longer than ``retention.history_ms`` ago. ``more`` ((name, purge(limit) -> rows
    deleted) pairs) holds the extensions' purges (the response cache's expired entries, old
    webhook deliveries): the hook point purge_steps of engine/core/extension.py."""

    def __init__(self, service, outbox, history, retention, batch_size=1000, more=()):
        self.service = service
        self.outbox = outbox
        self.history = history
        self.retention = retention
        self.batch_size = batch_size
        self.more = more

    def sweep(self):
        """One pass, until every table is clean; returns how many rows of each went."""
        size, keep = self.batch_size, self.retention
        counts = {
            'snapshots': _drain(lambda: self.service.purge_expired_snapshots(size)),
            'outbox': _drain(lambda: self.outbox.purge_finished(keep.outbox_ms, size)),
            'history': _drain(lambda: self.history.purge_finished(keep.history_ms, size)),
        }
        for name, purge in self.more:
            counts[name] = _drain(lambda purge=purge: purge(size))
        if any(counts.values()):
            log_event('housekeeping.purged', **counts)
        return counts


class Retention(NamedTuple):
    """How long finished rows are kept (ms): outbox events, history rows."""

    outbox_ms: int
    history_ms: int

    @classmethod
    def from_config(cls, config):
        return cls(config.outbox_retention_ms, config.history_retention_ms)


def _drain(delete_batch):
    total = 0
    while True:
        deleted = delete_batch()
        total += deleted
        if not deleted:
            return total
