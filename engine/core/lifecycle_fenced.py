"""What the holder of a running job writes under its fence (architecture decision 3): progress,
a scheduled retry, a deferral (contracts §1.8) and the hand-back of its lock. A part of
AiJobLifecycleRepository (core/lifecycle.py), which gives it ``store``, ``outbox``, ``get`` and
``_in_transaction``.

Each is one fenced UPDATE; a fence that no longer holds writes nothing and raises
JobLockConflictError (a deferral after a cancel request raises JobCancelledError).
"""

from . import history
from .errors import JobCancelledError, JobLockConflictError
from .history import NewEvent, insert_events
from .lifecycle_sql import fenced_update
from .models import AiJob
from .states import RUNNING


class FencedWrites:
    """AiJobLifecycleRepository's writes by a running job's holder, its status unchanged."""

    def release_lock(self, job_id, fence):
        """Let the lock expire now (a stopping worker hands the job back); the job stays
        running, and the next worker to pop it takes it over (architecture decision 4)."""
        self._fenced(job_id, fence, 'lock_until = {now}')

    def defer(self, job_id, fence, delay_ms, reason, detail=None, wake_by=None):
        """The lock holder hands the job back until ``delay_ms`` from now (a rate limit or a
        budget said wait; contracts §1.8): the job stays ``running`` with no holder
        (``locked_by`` NULL) and ``lock_until`` at its wake time, so no lock takes it before
        then and the reaper does not take it for lost; ``defer_count`` + 1, so the next lock is
        no attempt of the queue's; no retry is spent. In one transaction with the history's
        ``deferred`` row and the durable wake-up (an outbox event due at that time, claimed by
        ``wake_by`` when that process pushes it itself). Refused once a cancel was requested
        (JobCancelledError: the holder finishes the job cancelled) or when the fence no longer
        holds (JobLockConflictError). Returns the wake-up event."""
        delay_ms = max(0, int(delay_ms))
        fence_sql, fence_params = fence.sql(self.store)
        update = fenced_update(
            'locked_by = NULL, lock_until = {now_plus}, defer_count = defer_count + 1, '
            'updated_at = {now}',
            fence_sql,
            'cancel_requested_at IS NULL',
        )
        params = (self.store.ms_param(delay_ms), job_id) + fence_params
        event_detail = {'reason': reason, 'delayMs': delay_ms, **(detail or {}), **fence.actor()}
        event = NewEvent(job_id, history.DEFERRED, fence.attempt_no, event_detail)

        def write(tx):
            if self.store.execute(update, params).rowcount != 1:
                job = self.get(job_id)
                held = (job.locked_by, job.attempt_no) == (fence.instance_id, fence.attempt_no)
                if job.lifecycle_status == RUNNING and held and job.cancel_requested_at:
                    raise JobCancelledError('cancel requested before the deferral')
                raise JobLockConflictError(job_id, 'lock lost')
            insert_events(self.store, [event])
            job = (
                AiJob.select(
                    AiJob.id,
                    AiJob.job_type,
                    AiJob.queue_name,
                    AiJob.priority,
                    AiJob.attempt_no,
                    AiJob.user_id,  # the wake-up's message names its user's queue key
                )
                .where(AiJob.id == job_id)
                .get()
            )
            return self.outbox.create_wake_event(tx, job, delay_ms, claimed_by=wake_by)

        return self._in_transaction(write)

    def set_progress(self, job_id, fence, progress, milestone=False):
        """Record progress (0–100) of a running job; only its lock holder may. It never goes
        back: a retried call or a takeover starts its own count again from 0. ``milestone``:
        the caller's attempt reached a new multiple of ten, which the history keeps."""
        progress = max(0, min(100, int(progress)))
        sets = 'progress = CASE WHEN progress < %s THEN %s ELSE progress END, updated_at = {now}'
        if not milestone:
            return self._fenced(job_id, fence, sets, (progress, progress))
        event = NewEvent(job_id, history.PROGRESS, fence.attempt_no, {'progress': progress})
        self._in_transaction(
            lambda tx: self._fenced(job_id, fence, sets, (progress, progress), [event])
        )

    def count_retry(self, job_id, fence, retry_no, error=None, backoff_ms=0):
        """The engine schedules call ``retry_no`` + 1 of the provider after ``error`` (a
        JobFailure), in ``backoff_ms``: ``retry_count`` becomes ``retry_no`` (set, not added
        to: a write tried again after its answer was lost counts the retry once), and the
        history's ``retry_scheduled`` row."""
        detail = {'retryNo': retry_no, 'backoffMs': int(backoff_ms)}
        if error is not None:
            detail.update(errorCode=error.code, internalMessage=str(error)[:2000])
        detail.update(fence.actor())
        event = NewEvent(job_id, history.RETRY_SCHEDULED, fence.attempt_no, detail)
        self._in_transaction(
            # updated_at changes the row even when retry_count has that value already (MySQL
            # counts changed rows, and an unchanged row would read as a lost lock).
            lambda tx: self._fenced(
                job_id, fence, 'retry_count = %s, updated_at = {now}', (retry_no,), [event]
            )
        )

    def _fenced(self, job_id, fence, sets, set_params=(), events=()):
        """The fenced UPDATE, then ``events`` (in the caller's transaction)."""
        fence_sql, fence_params = fence.sql(self.store)
        update = fenced_update(sets, fence_sql)
        if self.store.execute(update, set_params + (job_id,) + fence_params).rowcount != 1:
            raise JobLockConflictError(job_id, 'lock lost')
        if events:
            insert_events(self.store, events)
