"""The lifecycle state machine (contracts §1.2–§1.5): a job's five states, the edges between
them, the legacy names filters still accept, and why a refused write was refused.

Only the lifecycle repository (core/lifecycle.py) writes a status; this module says which
writes are legal, and reads nothing.
"""

from enum import Enum

from .errors import (
    FinishWrittenError,
    IllegalTransitionError,
    JobAlreadyCancelledError,
    JobCancelledError,
    JobLockConflictError,
    JobNotCancellableError,
)


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


def refusal(job, to_status, written_by_fence=False):
    """Why a compare-and-set toward ``to_status`` matched nothing, given ``job`` as read just
    after it, as the error to raise (contracts §1.4). ``written_by_fence``: the fence of that
    terminal write already wrote this status (an earlier try committed, its answer lost with
    the connection): FinishWrittenError, nothing more to write."""
    current = job.lifecycle_status
    if written_by_fence:
        return FinishWrittenError(job.id, current)
    if to_status == CANCELLED and current == CANCELLED:
        return JobAlreadyCancelledError(job.id, current, to_status)
    if to_status == CANCELLED and current in TERMINAL:
        return JobNotCancellableError(job.id, current, to_status)
    if not is_legal(current, to_status):
        return IllegalTransitionError(job.id, current, to_status)
    if to_status == SUCCEEDED and job.cancel_requested_at is not None:
        return JobCancelledError('cancel requested before the result was committed')
    return JobLockConflictError(job.id)
