"""Cancelling a job (contracts §1.4, §5.4): by its owner, at once while nobody holds it (queued
or deferred), else a cancel request that its holder (the engine) or the reaper finishes as
running → cancelled under its fence. A part of AiJobLifecycleRepository (core/lifecycle.py),
which gives it ``store``, ``outbox``, ``get``, ``_finish``, ``_in_transaction`` and
``_refusal``.
"""

from . import admission, history
from .history import NewEvent, insert_events
from .models import AiJob
from .states import CANCELLED, QUEUED, RUNNING

CANCELLED_VALUES = {'error_code': 'CANCELLED', 'public_error_message': 'The job was cancelled.'}


class CancelWrites:
    """AiJobLifecycleRepository's cancels and cancel requests."""

    def mark_cancelled(self, job_id, *, fence=None):
        """Without a fence (the owner cancels): queued → cancelled at once, running → cancel
        requested (the engine finishes it); returns the job. With a fence (the engine or the
        reaper): running → cancelled, once a cancel was requested."""
        if fence is not None:
            return self._finish(
                job_id,
                CANCELLED,
                fence,
                CANCELLED_VALUES,
                'cancel_requested_at IS NOT NULL',
                detail={'errorCode': 'CANCELLED'},
            )
        if self._in_transaction(lambda tx: self._cancel_queued(tx, job_id)):
            return self.get(job_id)
        if self._in_transaction(lambda tx: self._cancel_deferred(tx, job_id)):
            return self.get(job_id)
        return self.request_cancel(job_id)

    def _cancelled_now(self):
        """The columns of a job cancelled at once, by ``_cancel_queued`` or ``_cancel_deferred``
        (nobody holds it, so nobody else would finish it)."""
        now = self.store.now()
        return {
            AiJob.error_code: 'CANCELLED',
            AiJob.public_error_message: CANCELLED_VALUES['public_error_message'],
            AiJob.cancel_requested_at: now,
            AiJob.finished_at: now,
            AiJob.lifecycle_status: CANCELLED,
            AiJob.updated_at: now,
        }

    def _cancel_queued(self, tx, job_id):
        """queued → cancelled with its terminal event; False if the job was not queued."""
        changed = (
            AiJob.update(self._cancelled_now())
            .where((AiJob.id == job_id) & (AiJob.lifecycle_status == QUEUED))
            .execute()
        )
        if changed:
            self.outbox.create_terminal_event(tx, job_id, CANCELLED)
            admission.release(self.store, [job_id])
            # Nothing ever locked a queued job: attempt 0.
            insert_events(
                self.store, [NewEvent(job_id, history.CANCELLED, 0, {'errorCode': 'CANCELLED'})]
            )
        return bool(changed)

    def _cancel_deferred(self, tx, job_id):
        """running → cancelled at once for a deferred job (no holder: nobody else would finish
        it), with its terminal event; False if the job was not waiting deferred. The CAS on
        ``locked_by IS NULL`` races the wake-up's lock: one of them wins."""
        values = self._cancelled_now()
        values[AiJob.lock_until] = None  # it held the wake time: a cancelled job waits for nothing
        changed = (
            AiJob.update(values)
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & AiJob.locked_by.is_null()
                & AiJob.cancel_requested_at.is_null()
            )
            .execute()
        )
        if changed:
            self.outbox.create_terminal_event(tx, job_id, CANCELLED)
            admission.release(self.store, [job_id])
            attempt_no = AiJob.select(AiJob.attempt_no).where(AiJob.id == job_id).scalar()
            detail = {'errorCode': 'CANCELLED', 'while': 'deferred'}
            insert_events(self.store, [NewEvent(job_id, history.CANCELLED, attempt_no, detail)])
        return bool(changed)

    def request_cancel(self, job_id):
        """Set ``cancel_requested_at`` on a running job (idempotent). Returns the job."""

        def write(tx):
            changed = (
                AiJob.update({AiJob.cancel_requested_at: self.store.now()})
                .where(
                    (AiJob.id == job_id)
                    & (AiJob.lifecycle_status == RUNNING)
                    & AiJob.cancel_requested_at.is_null()
                )
                .execute()
            )
            job = self.get(job_id)
            if changed:
                event = NewEvent(job_id, history.CANCEL_REQUESTED, job.attempt_no, {})
                insert_events(self.store, [event])
            return changed, job

        changed, job = self._in_transaction(write)
        if changed or (job.lifecycle_status == RUNNING and job.cancel_requested_at):
            return job
        raise self._refusal(job_id, CANCELLED, job)
