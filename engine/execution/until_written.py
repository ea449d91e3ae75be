"""A job's write that waits out a store outage: the job stays this worker's through it (its
heartbeats resume with the store), and its result is written when the store returns instead of
being dropped."""

import logging
import time

from ..core.errors import FinishWrittenError
from ..core.logs import log_event
from .attempt import AttemptAbandoned

# Waits between tries of a job's write while the store is unreachable.
STORE_RETRY_FIRST_S = 0.2
STORE_RETRY_MAX_S = 1.0


class UntilWritten:
    """``until_written(a, write)``: run ``write`` in a unit of database work (``unit()``), again
    while the store is unreachable. Gives up only when attempt ``a`` is abandoned (its lock was
    lost, or the worker stops). A terminal write whose try before committed, though its answer
    was lost, is done."""

    def __init__(self, store, unit):
        self.store = store
        self.unit = unit

    def __call__(self, a, write):
        delay_s = STORE_RETRY_FIRST_S
        while True:
            try:
                with self.unit():
                    return write()
            except FinishWrittenError as exc:
                log_event('job.finish_found_written', job_id=a.job.id, status=exc.status)
                return None
            except Exception as exc:
                if not self.store.is_unreachable(exc) or a.abandoned:
                    raise
                log_event(
                    'job.store_unreachable',
                    logging.WARNING,
                    job_id=a.job.id,
                    retry_in_s=delay_s,
                    error_type=exc.__class__.__name__,
                )
            time.sleep(delay_s)
            if a.abandoned:
                raise AttemptAbandoned(a.job.id)
            delay_s = min(STORE_RETRY_MAX_S, delay_s * 2)
