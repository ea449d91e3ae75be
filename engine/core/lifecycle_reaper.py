"""What the housekeeping reads and marks (dispatch/housekeeping.py): running jobs whose lock
expired, for the reaper (contracts §1.7), with the ``worker_lost`` row it writes before it
hands one on; and jobs left queued, for the reconciler. A part of AiJobLifecycleRepository
(core/lifecycle.py), which gives it ``store``, ``_fenced`` (lifecycle_fenced.py) and
``_in_transaction``. None of them writes a status.
"""

from . import history
from .fences import ExpiredLockFence
from .history import NewEvent, insert_events
from .models import AiJob, AiJobEvent
from .states import QUEUED, RUNNING


class ReaperQueries:
    """AiJobLifecycleRepository's reads and marks for the reaper and the reconciler."""

    def find_expired_locks(self, threshold_ms, limit=100):
        """Running jobs whose lock expired more than ``threshold_ms`` ago (contracts §1.7)."""
        return list(
            AiJob.select()
            .where(
                (AiJob.lifecycle_status == RUNNING)
                & (AiJob.lock_until < self.store.now_plus_ms(-threshold_ms))
            )
            .order_by(AiJob.lock_until)
            .limit(limit)
        )

    def find_stale_queued(self, older_than_ms, limit=100):
        """Jobs still queued ``older_than_ms`` after their last update (the reconciler's input)."""
        return list(
            AiJob.select()
            .where(
                (AiJob.lifecycle_status == QUEUED)
                & (AiJob.updated_at < self.store.now_plus_ms(-older_than_ms))
            )
            .order_by(AiJob.created_at)
            .limit(limit)
        )

    def touch_queued(self, job_ids):
        """Mark queued jobs as just re-published, so the reconciler waits again before the next."""
        if job_ids:
            AiJob.update({AiJob.updated_at: self.store.now()}).where(
                AiJob.id.in_(list(job_ids)) & (AiJob.lifecycle_status == QUEUED)
            ).execute()

    def record_worker_lost(self, job):
        """The reaper is about to hand ``job`` (as it read it: lock expired) to another worker:
        its history says so, once per attempt however many sweeps push it again. The fenced
        touch of the row checks the lock is still expired at that attempt (else
        JobLockConflictError: it heartbeated or was taken over meanwhile) and holds the row, so
        this row always comes before the takeover it leads to. Returns whether it wrote one."""
        fence = ExpiredLockFence(job.attempt_no, 0)
        detail = {'worker': job.locked_by, 'by': 'reaper'}
        event = NewEvent(job.id, history.WORKER_LOST, job.attempt_no, detail)

        def write(tx):
            self._fenced(job.id, fence, 'updated_at = {now}')
            seen = (
                AiJobEvent.select(AiJobEvent.id)
                .where(
                    (AiJobEvent.job_id == job.id)
                    & (AiJobEvent.kind == history.WORKER_LOST)
                    & (AiJobEvent.attempt_no == job.attempt_no)
                )
                .exists()
            )
            if not seen:
                insert_events(self.store, [event])
            return not seen

        return self._in_transaction(write)
