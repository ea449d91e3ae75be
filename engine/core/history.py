"""The transition history (architecture decision 14): one ``ai_job_event`` row per lifecycle
change of a job, written in the transaction that makes the change, and read back in id order.

Writers add their rows through ``insert_events`` (one multi-row INSERT per transaction, whatever
the number of jobs it changes). Readers get ``JobEvent``s from ``JobHistory``; ``public()`` is
what a job's owner may see, ``admin()`` everything.
"""

import datetime
from dataclasses import dataclass
from typing import NamedTuple

from .models import AiJob, AiJobEvent
from .sql import insert_row, rows_together

# The kinds of event, in the order a job's life usually runs through them.
CREATED = 'created'
DISPATCHED = 'dispatched'  # claimed for a push to its queue, the push following the commit
STARTED = 'started'  # the first lock: attempt 1, queued → running
TAKEN_OVER = 'taken_over'  # a later lock of a running job whose lock expired or was handed back
RETRY_SCHEDULED = 'retry_scheduled'
FALLBACK = 'fallback'  # the next call goes to another route entry (from, to, errorCode)
WORKER_LOST = 'worker_lost'  # the reaper found the lock expired and handed the job on
PROGRESS = 'progress'  # a milestone: at most one per 10 points of progress and attempt
CANCEL_REQUESTED = 'cancel_requested'
# The job waits without a worker until a time (a rate limit, a budget): no retry spent.
DEFERRED = 'deferred'
# The job's call went out in a provider batch (engine/features/batches/): its batch id.
BATCH_SUBMITTED = 'batch_submitted'
SUCCEEDED = 'succeeded'
FAILED = 'failed'
CANCELLED = 'cancelled'
RETRIED = 'retried'  # an admin made a new job from this finished one (its id in the detail)
CACHE_HIT = 'cache_hit'  # the response cache answered a call (written with the success)
KINDS = (
    CREATED,
    DISPATCHED,
    STARTED,
    TAKEN_OVER,
    RETRY_SCHEDULED,
    FALLBACK,
    WORKER_LOST,
    PROGRESS,
    CANCEL_REQUESTED,
    CACHE_HIT,
    SUCCEEDED,
    FAILED,
    CANCELLED,
    RETRIED,
    DEFERRED,
    BATCH_SUBMITTED,
)
# Progress milestones are this many points apart.
PROGRESS_STEP = 10

# Detail keys only an admin sees: which process did it, and error text not meant for users.
# ``sourceJobId`` (the job whose answer a cache hit reused) may be another user's job.
ADMIN_ONLY = frozenset(('worker', 'dispatcher', 'internalMessage', 'sourceJobId'))
_INSERT = 'INSERT INTO ai_job_event (job_id, kind, attempt_no, detail, created_at) VALUES '
_ROW = '(%s, %s, %s, %s, {now})'


class NewEvent(NamedTuple):
    """A row to write: the job, the kind, the job's attempt when it happened, the detail."""

    job_id: str
    kind: str
    attempt_no: int
    detail: dict


def insert_events(store, events):
    """Write ``events`` (NewEvent) inside the caller's transaction, stamped with the database
    clock: one INSERT for up to sql.ROWS_PER_INSERT rows (with the other rows of a group commit,
    sql.rows_together). Returns how many were written."""
    events = list(events)
    assert not events or store.in_transaction(), 'events are written with their change'
    encode = AiJobEvent.detail.db_value
    rows = [(e.job_id, e.kind, e.attempt_no, encode(e.detail or {})) for e in events]
    with rows_together():
        for params in rows:
            insert_row(_INSERT, _ROW, params)
    return len(events)


def progress_milestone(percent):
    """The milestone ``percent`` reaches: 0, 10, … 100."""
    return percent - percent % PROGRESS_STEP


@dataclass(frozen=True)
class JobEvent:
    """One row of a job's history as read back."""

    id: int
    job_id: str
    kind: str
    attempt_no: int
    detail: dict
    at: datetime.datetime  # naive UTC, from the database clock

    def admin(self):
        """Everything, JSON-ready and camelCase."""
        return self._shape(dict(self.detail))

    def public(self):
        """What the job's owner may see: no worker or dispatcher ids, no internal messages."""
        return self._shape({k: v for k, v in self.detail.items() if k not in ADMIN_ONLY})

    def _shape(self, detail):
        return {
            'id': self.id,
            'jobId': self.job_id,
            'kind': self.kind,
            'attemptNo': self.attempt_no,
            'detail': detail,
            'at': self.at.isoformat(timespec='milliseconds') + 'Z',
        }

    @classmethod
    def from_row(cls, row):
        return cls(row.id, row.job_id, row.kind, row.attempt_no, row.detail or {}, row.created_at)


class JobHistory:
    """Reads the history of one job."""

    def __init__(self, store):
        self.store = store

    def list(self, job_id, after_id=None, limit=None):
        """The events of ``job_id`` in the order they were written (id order), only those after
        ``after_id`` when given, at most ``limit`` when given."""
        query = AiJobEvent.select().where(AiJobEvent.job_id == job_id)
        if after_id is not None:
            query = query.where(AiJobEvent.id > after_id)
        query = query.order_by(AiJobEvent.id)
        if limit is not None:
            query = query.limit(limit)
        return [JobEvent.from_row(row) for row in query]

    def purge_finished(self, older_than_ms, limit=1000):
        """Delete up to ``limit`` history rows older than ``older_than_ms`` of jobs that finished
        before then too: a job still queued or running (or finished since) keeps every row, so
        a history is only ever cut once its job is long done. Returns how many were deleted."""
        cutoff = self.store.now_plus_ms(-older_than_ms)
        ids = [
            row.id
            for row in AiJobEvent.select(AiJobEvent.id)
            .join(AiJob, on=(AiJob.id == AiJobEvent.job_id))
            # finished_at is set by the terminal write only (NULL never compares true)
            .where((AiJobEvent.created_at < cutoff) & (AiJob.finished_at < cutoff))
            .limit(limit)
        ]
        if not ids:
            return 0
        return AiJobEvent.delete().where(AiJobEvent.id.in_(ids)).execute()
