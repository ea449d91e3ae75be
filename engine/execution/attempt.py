"""What the engine holds while it runs a job: the Attempt (the lock this worker holds on it,
shared with the supervisor thread) and what RESOLVE found for it."""

import threading
import time
from dataclasses import dataclass, field

from ..core.errors import JobCancelledError
from ..core.fences import Fence
from ..core.models import AiJob

# The error code of a usage row whose call finished after its worker lost the lock or stopped.
LOCK_LOST = 'INTERNAL_ATTEMPT_ABANDONED'


class AttemptAbandoned(Exception):
    """This worker must stop touching the job: its lock was lost or the worker is stopping."""


@dataclass
class Attempt:
    """One lock this worker holds on one job, shared with the supervisor thread."""

    job: AiJob
    definition: object
    fence: Fence
    snapshot: dict = None  # the job's frozen {"input", "overrides"}, read with the lock
    retries_used: int = 0  # provider calls retried so far, this attempt's and earlier ones'
    milestone: int = 0  # the last progress milestone this attempt wrote to the history
    cancel_event: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False
    internal_retries: int = 0  # retries after an internal error (bounded apart)
    defer_success: bool = False  # a success returns a Success for the caller to commit
    route: object = None  # the gateway's place in the job's route (gateway/routes.py)
    adopted: bool = False  # locked by a lock whose answer was lost: its row is not fresh
    started: float = field(default_factory=time.monotonic)

    def abandon(self):
        self.abandoned = True
        self.cancel_event.set()

    def stop_if_told(self):
        if self.abandoned:
            raise AttemptAbandoned(self.job.id)
        if self.cancel_event.is_set():
            raise JobCancelledError('cancel requested')


@dataclass
class Resolved:
    """What RESOLVE found for a job."""

    input: dict
    credential: object
    provider: object
    model: str
    projector: object


def ms_since(started):
    """Whole milliseconds since the monotonic instant ``started``."""
    return int((time.monotonic() - started) * 1000)
