"""AiJobLifecycleRepository: the only code that writes ``ai_job.lifecycle_status`` (contracts §1.4).

Every write is one compare-and-set UPDATE whose WHERE clause holds both the legal source states of
the edge (contracts §1.2) and, for a running job, the fence of the worker that holds it
(architecture decision 3). When the UPDATE matches no row nothing was written, and the row is read
once to say why: an edge contracts §1.3 forbids raises ``IllegalTransitionError``; a lost race or a
stale fence raises ``JobLockConflictError``.
"""

from dataclasses import dataclass
from enum import Enum

from peewee import fn

from .errors import (
    IllegalTransitionError,
    JobAlreadyCancelledError,
    JobCancelledError,
    JobLockConflictError,
    JobNotCancellableError,
    JobNotFoundError,
)
from .models import AiJob


class Status(str, Enum):
    QUEUED = 'queued'
    RUNNING = 'running'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    CANCELLED = 'cancelled'

    def __str__(self):
        return self.value


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (s.value for s in Status)
TERMINAL = frozenset((SUCCEEDED, FAILED, CANCELLED))

# contracts §1.2, plus running → running: a lock takeover after a worker died (architecture decision
# 4).
LEGAL_EDGES = frozenset(
    (
        (QUEUED, RUNNING),
        (QUEUED, CANCELLED),
        (RUNNING, RUNNING),
        (RUNNING, SUCCEEDED),
        (RUNNING, FAILED),
        (RUNNING, CANCELLED),
    )
)

# contracts §1.5: legacy status names, still accepted on input filters (architecture decision 9).
LEGACY_STATUS_TO_LIFECYCLE = {
    'pending': QUEUED,
    'processing': RUNNING,
    'completed': SUCCEEDED,
    'failed': FAILED,
    'cancelled': CANCELLED,
    'cancel_requested': CANCELLED,
}


def is_legal(from_status, to_status):
    return (from_status, to_status) in LEGAL_EDGES


@dataclass(frozen=True)
class Fence:
    """The worker that holds a running job: its instance and the attempt it locked."""

    instance_id: str
    attempt_no: int

    def condition(self, store):
        return (AiJob.locked_by == self.instance_id) & (AiJob.attempt_no == self.attempt_no)


@dataclass(frozen=True)
class ExpiredLockFence:
    """The reaper's fence: the attempt it saw, and only while that lock has been expired for
    ``expired_for_ms`` — a worker that heartbeats in the meantime wins."""

    attempt_no: int
    expired_for_ms: int

    def condition(self, store):
        return (AiJob.attempt_no == self.attempt_no) & (
            AiJob.lock_until < store.now_plus_ms(-self.expired_for_ms)
        )


class AiJobLifecycleRepository:
    def __init__(self, store, lock_ttl_ms=60_000, queue_attempts=None):
        self.store = store
        self.lock_ttl_ms = lock_ttl_ms
        # Locks a job may take in all, per queue (contracts §3.1 "attempts"); takeovers stop there.
        self.queue_attempts = dict(queue_attempts or {'ai-interactive': 2, 'ai-background': 3})

    # ------------------------------------------------------------ create
    def create_job(
        self,
        tx,
        *,
        job_id,
        user_id,
        job_type,
        queue_name,
        priority,
        target_type,
        target_id,
        idempotency_key,
        request_fingerprint,
        credential_mode,
        credential_id=None,
        prompt_version=None,
        output_schema_version=None,
        max_retry_count=0,
        retry_of_job_id=None,
    ):
        """Insert a job in ``queued``, inside the caller's transaction ``tx`` (the caller writes
        the outbox event in the same one)."""
        assert tx is not None and self.store.in_transaction(), 'create_job needs a transaction'
        now = self.store.now()
        AiJob.insert(
            id=job_id,
            lifecycle_status=QUEUED,
            queue_name=queue_name,
            priority=priority,
            progress=0,
            user_id=user_id,
            job_type=job_type,
            target_type=target_type,
            target_id=target_id,
            idempotency_key=idempotency_key,
            request_fingerprint=request_fingerprint,
            credential_mode=credential_mode,
            credential_id=credential_id,
            prompt_version=prompt_version,
            output_schema_version=output_schema_version,
            attempt_no=0,
            retry_count=0,
            max_retry_count=max_retry_count,
            retry_of_job_id=retry_of_job_id,
            created_at=now,
            updated_at=now,
        ).execute()
        return self.get(job_id)

    # ------------------------------------------------------------ lock, heartbeat, progress
    def lock_job(self, job_id, instance_id, lock_ttl_ms=None):
        """queued → running (CAS), or take over a running job whose lock expired while its queue
        allows another attempt. Returns the job; ``job.attempt_no`` is the new fence."""
        now = self.store.now()
        takeover = (
            (AiJob.lifecycle_status == RUNNING)
            & (AiJob.lock_until < now)
            & AiJob.cancel_requested_at.is_null()
            & self._attempts_left()
        )
        changed = (
            AiJob.update(
                {
                    AiJob.lifecycle_status: RUNNING,
                    AiJob.locked_by: instance_id,
                    AiJob.locked_at: now,
                    AiJob.lock_until: self.store.now_plus_ms(lock_ttl_ms or self.lock_ttl_ms),
                    AiJob.started_at: fn.COALESCE(AiJob.started_at, now),
                    AiJob.attempt_no: AiJob.attempt_no + 1,
                    AiJob.updated_at: now,
                }
            )
            .where((AiJob.id == job_id) & ((AiJob.lifecycle_status == QUEUED) | takeover))
            .execute()
        )
        if not changed:
            raise self._refusal(job_id, RUNNING)
        return self.get(job_id)

    def extend_lock(self, job_id, fence, lock_ttl_ms=None):
        """Heartbeat: push ``lock_until`` forward. Returns the job (the caller checks
        ``cancel_requested_at``); raises JobLockConflictError if the fence no longer holds."""
        changed = (
            AiJob.update(
                {
                    AiJob.lock_until: self.store.now_plus_ms(lock_ttl_ms or self.lock_ttl_ms),
                }
            )
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & fence.condition(self.store)
            )
            .execute()
        )
        if not changed:
            raise JobLockConflictError(job_id, 'lock lost')
        return self.get(job_id)

    def release_lock(self, job_id, fence):
        """Let the lock expire now (a stopping worker hands the job back); the job stays
        running, and the next worker to pop it takes it over (architecture decision 4)."""
        changed = (
            AiJob.update({AiJob.lock_until: self.store.now()})
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & fence.condition(self.store)
            )
            .execute()
        )
        if not changed:
            raise JobLockConflictError(job_id, 'lock lost')

    def set_progress(self, job_id, fence, progress):
        """Record progress (0–100) of a running job; only its lock holder may."""
        progress = max(0, min(100, int(progress)))
        changed = (
            AiJob.update({AiJob.progress: progress, AiJob.updated_at: self.store.now()})
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & fence.condition(self.store)
            )
            .execute()
        )
        if not changed:
            raise JobLockConflictError(job_id, 'lock lost')

    def count_retry(self, job_id, fence):
        """The engine starts another attempt of the provider call (``retry_count`` + 1)."""
        changed = (
            AiJob.update({AiJob.retry_count: AiJob.retry_count + 1})
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & fence.condition(self.store)
            )
            .execute()
        )
        if not changed:
            raise JobLockConflictError(job_id, 'lock lost')

    # ------------------------------------------------------------ terminal states
    def mark_succeeded(self, job_id, *, fence, output_hash=None):
        """running → succeeded, only for the lock holder and only if nobody asked to cancel."""
        now = self.store.now()
        values = {AiJob.progress: 100, AiJob.output_hash: output_hash}
        where = fence.condition(self.store) & AiJob.cancel_requested_at.is_null()
        return self._finish(
            job_id, SUCCEEDED, (AiJob.lifecycle_status == RUNNING) & where, values, now
        )

    def mark_failed(self, job_id, error, *, fence):
        """running → failed with the error's code, public and internal messages."""
        now = self.store.now()
        values = {
            AiJob.error_code: error.code,
            AiJob.public_error_message: (error.public_message or '')[:512],
            AiJob.internal_error_message: str(error)[:8000],
        }
        where = (AiJob.lifecycle_status == RUNNING) & fence.condition(self.store)
        return self._finish(job_id, FAILED, where, values, now)

    def mark_cancelled(self, job_id, *, fence=None):
        """Without a fence (the owner cancels): queued → cancelled at once; running → cancel
        requested (the engine finishes it). With a fence (the engine): running → cancelled,
        once a cancel was requested."""
        now = self.store.now()
        values = {
            AiJob.error_code: 'CANCELLED',
            AiJob.public_error_message: 'The job was cancelled.',
        }
        if fence is not None:
            where = (
                (AiJob.lifecycle_status == RUNNING)
                & fence.condition(self.store)
                & AiJob.cancel_requested_at.is_null(False)
            )
            return self._finish(job_id, CANCELLED, where, values, now)
        values.update({AiJob.cancel_requested_at: now, AiJob.finished_at: now})
        if self._update(job_id, CANCELLED, AiJob.lifecycle_status == QUEUED, values, now):
            return self.get(job_id)
        return self.request_cancel(job_id)

    def request_cancel(self, job_id):
        """Set ``cancel_requested_at`` on a running job (idempotent). Returns the job."""
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
        if changed or (job.lifecycle_status == RUNNING and job.cancel_requested_at):
            return job
        raise self._refusal(job_id, CANCELLED, job)

    def transition(self, job_id, to_status, *, instance_id=None, fence=None, error=None):
        """Move a job to ``to_status`` through the named method for that edge. Nothing enters
        ``queued`` except ``create_job``, so that target always raises."""
        if to_status == RUNNING:
            return self.lock_job(job_id, instance_id)
        if to_status == SUCCEEDED:
            return self.mark_succeeded(job_id, fence=fence)
        if to_status == FAILED:
            return self.mark_failed(job_id, error, fence=fence)
        if to_status == CANCELLED:
            return self.mark_cancelled(job_id, fence=fence)
        raise self._refusal(job_id, to_status)

    # ------------------------------------------------------------ reads
    def get(self, job_id):
        job = AiJob.get_or_none(AiJob.id == job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    def find_by_lifecycle_status(self, statuses, queue_name=None, limit=100):
        query = AiJob.select().where(AiJob.lifecycle_status.in_([str(s) for s in statuses]))
        if queue_name:
            query = query.where(AiJob.queue_name == queue_name)
        return list(query.order_by(AiJob.created_at).limit(limit))

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

    def attempts_allowed(self, queue_name):
        return self.queue_attempts.get(queue_name, 1)

    # ------------------------------------------------------------ internals
    def _attempts_left(self):
        condition = None
        for queue_name, attempts in self.queue_attempts.items():
            clause = (AiJob.queue_name == queue_name) & (AiJob.attempt_no < attempts)
            condition = clause if condition is None else (condition | clause)
        return condition

    def _update(self, job_id, to_status, where, values, now):
        values = dict(values)
        values[AiJob.lifecycle_status] = to_status
        values[AiJob.updated_at] = now
        return AiJob.update(values).where((AiJob.id == job_id) & where).execute() == 1

    def _finish(self, job_id, to_status, where, values, now):
        values = dict(values)
        values.update({AiJob.finished_at: now, AiJob.lock_until: None})
        if not self._update(job_id, to_status, where, values, now):
            raise self._refusal(job_id, to_status)
        return self.get(job_id)

    def _refusal(self, job_id, to_status, job=None):
        """Why a CAS toward ``to_status`` matched nothing, as the error to raise."""
        job = job or self.get(job_id)
        current = job.lifecycle_status
        if to_status == CANCELLED and current == CANCELLED:
            return JobAlreadyCancelledError(job_id, current, to_status)
        if to_status == CANCELLED and current in TERMINAL:
            return JobNotCancellableError(job_id, current, to_status)
        if not is_legal(current, to_status):
            return IllegalTransitionError(job_id, current, to_status)
        if to_status == SUCCEEDED and job.cancel_requested_at is not None:
            return JobCancelledError('cancel requested before the result was committed')
        return JobLockConflictError(job_id)
