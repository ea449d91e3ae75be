"""PROJECT and COMPLETE (contracts §5): a successful call's transaction (the fenced success
write, the projection, the call's usage row, all or nothing), written alone or handed to a
group commit with other jobs' (core/groupcommit.py), and the job's terminal writes."""

import time

from ..core.errors import (
    FinishWrittenError,
    IllegalTransitionError,
    InternalJobError,
    JobCancelledError,
    JobFailure,
    JobLockConflictError,
)
from ..core.logs import log_event
from ..core.models import canonical_hash
from ..core.states import CANCELLED, FAILED, SUCCEEDED
from .attempt import LOCK_LOST, ms_since


class Success:
    """A job whose provider call succeeded and whose PROJECT transaction is still to commit:
    ``work`` is that transaction's work, for a group commit; ``write_alone`` writes it in a
    transaction of its own (``execute``'s path, refusals included)."""

    def __init__(self, completion, a, resolved, output, usage, latency_ms, call):
        self.attempt = a
        self.resolved = resolved
        self.args = (a, resolved, usage, latency_ms, call)  # for projection_failed
        self.ready_at = time.monotonic()
        self.work = completion.projection(a, resolved, output, usage, latency_ms, call)
        self.write_alone = lambda: completion.project(a, resolved, output, usage, latency_ms, call)


class Completion:
    """The final writes of the jobs one engine runs. ``calls`` writes a call's usage row
    (calls.ProviderCalls); ``until_written`` waits out a store outage."""

    def __init__(self, store, lifecycle, calls, unit, until_written, group_commit, signals):
        self.store = store
        self.lifecycle = lifecycle
        self.calls = calls
        self.unit = unit
        self.until_written = until_written
        self.group_commit = group_commit
        self.signals = signals  # each job's end (core/signals.py)

    # ------------------------------------------------------------ PROJECT
    def project(self, a, resolved, output, usage, latency_ms, call):
        """The PROJECT transaction of a successful call, alone; returns the status reached."""
        self.until_written(
            a, lambda: self._project_in_unit(a, resolved, output, usage, latency_ms, call)
        )
        return self.complete(a, SUCCEEDED, None)

    def projection(self, a, resolved, output, usage, latency_ms, call):
        """The PROJECT transaction's work, ``work(tx)``: the job succeeds, its output is
        projected and its call's usage recorded, all or nothing."""
        output_hash = canonical_hash(output)

        def work(tx):
            # The fenced write first: once it matched, this is the job's only projection, and a
            # refusal (lock lost, cancel requested) costs no projector work. In a group commit
            # the group's fenced writes go out together at its end: a refusal there rolls the
            # group back, and it runs again with each job's write first and on its own.
            self.lifecycle.mark_succeeded(a.job.id, fence=a.fence, output_hash=output_hash)
            resolved.projector.project(tx, a.job, output)
            self.calls.log_usage(a, call, usage, latency_ms, None)

        return work

    def _project_in_unit(self, a, resolved, output, usage, latency_ms, call):
        work = self.projection(a, resolved, output, usage, latency_ms, call)
        try:
            self.store.run_in_transaction(work)
        except Exception as exc:
            self.projection_failed(a, resolved, usage, latency_ms, call, exc)

    def projection_failed(self, a, resolved, usage, latency_ms, call, exc):
        """A PROJECT transaction raised ``exc`` and rolled back: record its call's usage as
        it stands, and raise what the job goes on with."""
        if isinstance(exc, FinishWrittenError):  # committed, with its usage row, before
            raise exc
        if isinstance(exc, JobCancelledError):  # a cancel request beat the success write
            self.calls.log_usage(a, call, usage, latency_ms, None)
            raise exc
        if isinstance(exc, (JobLockConflictError, IllegalTransitionError)):
            # A zombie (its lock taken, or its job finished by the new holder): its result
            # goes, its cost stays.
            self.calls.log_usage(a, call, usage, latency_ms, LOCK_LOST)
            raise exc
        if isinstance(exc, JobFailure):
            raise exc
        if self.store.is_unreachable(exc):
            raise exc  # not the projection's fault: written again when the store returns
        self.calls.log_usage(a, call, usage, latency_ms, 'INTERNAL_PROJECTION_FAILED')
        raise InternalJobError(
            'projection failed: %s' % exc.__class__.__name__, code='INTERNAL_PROJECTION_FAILED'
        ) from exc

    def commit_group(self, ready):
        """The PROJECT transactions of ``ready`` (each a Success) in one group commit: one
        outcome per success, None when its work committed, else the exception its work raised
        (rolled back, the others' committed). With no connection to be had, each outcome is
        that outage: each job then waits it out alone."""
        try:  # the group's leader takes a connection (the engine's GroupCommit has its unit)
            return self.group_commit.run([success.work for success in ready])
        except Exception as exc:
            if not self.store.is_unreachable(exc):
                raise
            return [exc] * len(ready)

    # ------------------------------------------------------------ COMPLETE
    def fail(self, a, failure):
        self.until_written(a, lambda: self.lifecycle.mark_failed(a.job.id, failure, fence=a.fence))
        return self.complete(a, FAILED, failure.code)

    def finish_cancelled(self, a):
        self.until_written(a, lambda: self.lifecycle.mark_cancelled(a.job.id, fence=a.fence))
        return self.complete(a, CANCELLED, 'CANCELLED')

    def complete(self, a, status, error_code):
        """The job's end, once written: counted and logged. Returns ``status``."""
        run_s = time.monotonic() - a.started
        self.signals.job_finished(a.job.job_type, a.job.queue_name, status, run_s)
        log_event(
            'job.finished',
            job_id=a.job.id,
            job_type=a.job.job_type,
            status=status,
            error_code=error_code,
            attempt=a.job.attempt_no,
            retries=a.retries_used,
            run_ms=ms_since(a.started),
        )
        return status
