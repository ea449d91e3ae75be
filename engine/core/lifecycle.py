"""AiJobLifecycleRepository: the only code that writes ``ai_job.lifecycle_status`` (contracts §1.4).

Every write is one compare-and-set UPDATE whose WHERE clause holds both the legal source states of
the edge (contracts §1.2, core/states.py) and, for a running job, the fence of the worker that
holds it (architecture decision 3, core/fences.py). When the UPDATE matches no row nothing was
written, and the row is read once to say why: an edge contracts §1.3 forbids raises
``IllegalTransitionError``; a lost race or a stale fence raises ``JobLockConflictError``.

The repository is one class read in parts, one module each: the create and the reads here; the
lock and heartbeat in lifecycle_locks.py; the holder's fenced writes (progress, retry, deferral,
hand-back) in lifecycle_fenced.py; the terminal writes in lifecycle_finish.py; cancels in
lifecycle_cancel.py; the reaper's and reconciler's queries in lifecycle_reaper.py. Their SQL
text, per dialect, is in lifecycle_sql.py. No other module writes a status.
"""

from . import history
from .errors import JobNotFoundError
from .lifecycle_cancel import CancelWrites
from .lifecycle_fenced import FencedWrites
from .lifecycle_finish import FinishWrites
from .lifecycle_locks import LockWrites
from .lifecycle_reaper import ReaperQueries
from .lifecycle_sql import CREATE_COLUMNS, INSERT_JOB_HEAD, INSERT_JOB_ROW, lock_text
from .models import AiJob
from .outbox import OutboxRepository
from .sql import Statement, insert_row
from .states import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    refusal,
)


class AiJobLifecycleRepository(LockWrites, FencedWrites, FinishWrites, CancelWrites, ReaperQueries):
    """The only writer of a job's status (contracts §1.4), made of its parts' classes; each part
    uses the attributes set here and the helpers below."""

    def __init__(self, store, lock_ttl_ms=60_000, queue_attempts=None, outbox=None):
        self.store = store
        # Every terminal write adds its ai.job.<status> event in the same transaction
        # (architecture decision 15).
        self.outbox = outbox or OutboxRepository(store)
        self.lock_ttl_ms = lock_ttl_ms
        # Locks a job may take in all, per queue (contracts §3.1 "attempts"); takeovers stop there.
        self.queue_attempts = dict(queue_attempts or {'ai-interactive': 2, 'ai-background': 3})
        # The lock CAS; its takeover clause depends on the queues' attempt limits.
        self._lock_text = lock_text(self.queue_attempts)
        self._lock_statement = Statement(self._lock_text.replace('{ids}', 'id = %s'))

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
        the outbox event in the same one). Returns the job as written: the row joins the other
        rows of a ``rows_together()`` block (the creates of a group commit: one INSERT), and the
        job's creation time is filled in when it went out (returned by the INSERT, or on MySQL
        read back in the same round trip)."""
        assert tx is not None and self.store.in_transaction(), 'create_job needs a transaction'
        values = dict(
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
        )
        params = tuple(values[name] for name in CREATE_COLUMNS)
        job = AiJob(__no_default__=True, **values)

        def receive(returned):
            job.created_at = job.updated_at = AiJob.created_at.python_value(returned[1])

        returning = ('id, created_at', job_id, receive)
        read_back = not self.store.insert_returns()  # MySQL: a SELECT in the same round trip
        insert_row(
            INSERT_JOB_HEAD, INSERT_JOB_ROW, params, returning=returning, read_back=read_back
        )
        return job

    def transition(self, job_id, to_status, *, instance_id=None, fence=None, error=None):
        """Move a job to ``to_status`` through the named method for that edge and return it as
        it is now. Nothing enters ``queued`` except ``create_job``, so that target always
        raises."""
        if to_status == RUNNING:
            return self.lock_job(job_id, instance_id)
        if to_status == SUCCEEDED:
            self.mark_succeeded(job_id, fence=fence)
        elif to_status == FAILED:
            self.mark_failed(job_id, error, fence=fence)
        elif to_status == CANCELLED and fence is None:
            return self.mark_cancelled(job_id)
        elif to_status == CANCELLED:
            self.mark_cancelled(job_id, fence=fence)
        else:
            raise self._refusal(job_id, to_status)
        return self.get(job_id)

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

    def attempts_allowed(self, queue_name):
        return self.queue_attempts.get(queue_name, 1)

    def attempts_left(self, job):
        """May ``job`` (as read) be locked once more? Deferrals are no attempts."""
        used = job.attempt_no - (job.defer_count or 0)
        return used < self.attempts_allowed(job.queue_name)

    # ------------------------------------------------------------ internals (every part's)
    def _in_transaction(self, work):
        """``work(tx)`` in the caller's transaction (the PROJECT transaction of a success, or
        a group commit), else in one of its own: a terminal status never commits without its
        event, nor an event without its status."""
        if self.store.in_transaction():
            return work(True)
        with self.store.atomic() as tx:
            return work(tx)

    def _refusal(self, job_id, to_status, job=None, fence=None):
        """Why a CAS toward ``to_status`` matched nothing, as the error to raise (states.refusal).
        With the ``fence`` of a terminal write: FinishWrittenError when that same fence already
        wrote the same status (an earlier try committed, its answer lost with the connection)."""
        job = job or self.get(job_id)
        current = job.lifecycle_status
        written = fence is not None and current == to_status and self._finished_under(job, fence)
        return refusal(job, to_status, written)

    def _finished_under(self, job, fence):
        """Did ``fence`` write ``job``'s terminal status? Its history row says who did."""
        actor = fence.actor().items()
        return any(
            event.kind == job.lifecycle_status
            and event.attempt_no == fence.attempt_no
            and actor <= event.detail.items()
            for event in history.JobHistory(self.store).list(job.id)
        )
