"""AiJobExecutionEngine (contracts §5): runs one job through PREPARE, RESOLVE, EXECUTE, PROJECT and
COMPLETE. This module holds the phases and the batch loop: the lock and RESOLVE, the attempts with
their retries and deferrals, the cancel checks; one provider call and its usage row are
calls.py's, PROJECT and the terminal writes completion.py's.

Retries happen here, with the definition's backoff, and never by queue redelivery (contracts §5.5):
a message is acknowledged once the engine is done with the job, whatever the outcome. Every write is
fenced by the lock this worker took (architecture decision 3); losing it mid-way abandons the
attempt without writing anything.
"""

import functools
import logging
import threading
import time

from ..core.errors import (
    IllegalTransitionError,
    InternalJobError,
    JobCancelledError,
    JobDeferred,
    JobFailure,
    JobLockConflictError,
    JobNotFoundError,
    MisconfiguredJobError,
    UnknownJobTypeError,
)
from ..core.fences import Fence
from ..core.groupcommit import GroupCommit
from ..core.logs import log_event
from ..core.models import AiJob
from ..core.states import SUCCEEDED
from .attempt import Attempt, AttemptAbandoned, Resolved
from .calls import ProviderCalls
from .completion import Completion, Success
from .unheard_locks import UnheardLocks
from .until_written import UntilWritten

# What ``execute`` returns for a job handed back until its wake time (lifecycle.defer): not a
# terminal status, but the worker is done with the message.
DEFERRED = 'deferred'


class ExecutionEngine:
    def __init__(self, runtime, instance_id, waker=None):
        self.store = runtime.store
        self.registry = runtime.registry
        self.lifecycle = runtime.lifecycle
        self.ai = runtime.ai
        self.signals = runtime.signals  # what it says as jobs run (core/signals.py)
        self.instance_id = instance_id
        self.lock_ttl_ms = runtime.config.lock_ttl_ms
        # Pushes deferred jobs' wake-ups at their time (dispatch.wake.Waker, the Worker's);
        # without one the leader's dispatcher pushes them from the outbox when they are due.
        self.waker = waker
        self.held = {}  # job id -> Attempt, watched by the supervisor
        self._held_lock = threading.Lock()
        self.unheard_locks = UnheardLocks()  # guarded by _held_lock too
        # A unit of database work on this thread's connection. A pooled database (MySQL) gives
        # the connection back to the pool at the end of each unit; SQLite has no pool to share
        # and reopening its file costs more than the statements, so each thread keeps its own.
        self._unit = self.store.connection if self.store.dialect == 'mysql' else _no_connection
        # Where a terminal UPDATE's refusal is the server's error (Store.guards_row_counts), a
        # group's writes carry its COMMIT: one round trip for the whole finish.
        # The group's leader takes its connection: the callers waiting for it hold none.
        self.group_commit = GroupCommit(
            self.store, commit_with_rows=self.store.guards_row_counts, connection=self._unit
        )
        self._until_written = UntilWritten(self.store, self._unit)
        self.calls = ProviderCalls(
            self.store,
            self.lifecycle,
            self.ai,
            runtime.hooks.live_text,
            self._unit,
            self._until_written,
            self.signals,
        )
        self.completion = Completion(
            self.store,
            self.lifecycle,
            self.calls,
            self._unit,
            self._until_written,
            self.group_commit,
            self.signals,
        )

    # ------------------------------------------------------------ PREPARE
    def execute(self, job_id):
        """PREPARE: lock job ``job_id`` (CAS queued → running, or a takeover) and run it. Returns
        the terminal status it reached, or None when there was nothing for this worker to do
        (locked elsewhere, already terminal, lock lost, worker stopping).

        The engine takes a pooled connection for each unit of database work (the lock and
        RESOLVE, a cancel check, a progress write, PROJECT's transaction, a terminal write) and
        holds none while the provider works: a worker of 200 threads waiting on 200 AI calls
        needs a handful of connections, not 200."""
        with self._unit():  # PREPARE and RESOLVE: the lock, the run's row and snapshot, the key
            try:
                job, snapshot = self.lifecycle.lock_job_with_snapshot(
                    job_id, self.instance_id, self.lock_ttl_ms
                )
            except (JobNotFoundError, JobLockConflictError, IllegalTransitionError):
                return None  # gone, running elsewhere, or already finished
            attempt, resolved = self._prepare(job, snapshot)
        try:
            return self._run(attempt, resolved)
        finally:
            self._release_held(job_id)

    def execute_batch(self, job_ids, flush_after_s=0.05, on_job_ran=None):
        """``execute`` for several jobs popped together: ``claim`` them in one lock statement,
        then ``run_claimed`` them in turn on this thread. Returns {job id: status} (None as in
        ``execute``; jobs this call could not lock are left out)."""
        return self.run_claimed(self.claim(job_ids), flush_after_s, on_job_ran)

    def claim(self, job_ids):
        """PREPARE and RESOLVE for several jobs: one lock statement for all of them. Returns
        the claimed jobs, each held (heartbeated) from now on, for ``run_claimed``; jobs
        locked elsewhere, gone or already finished are left out."""
        return self._lock_and_prepare(list(dict.fromkeys(job_ids)))

    def run_claimed(self, prepared, flush_after_s=0.05, on_job_ran=None):
        """Run claimed jobs in turn on this thread; the final writes of the jobs that succeed
        are committed together (with other threads' through group commit) once they are all
        done or ``flush_after_s`` after the first was ready. Returns {job id: status}.
        ``on_job_ran(seconds)`` hears how long each job ran, its lock and final commit left
        out."""
        statuses = {}
        ready = []  # successes whose final write waits for the group's commit
        try:
            for attempt, resolved in prepared:
                if ready and time.monotonic() - ready[0].ready_at > flush_after_s:
                    statuses.update(self._commit_successes(ready))
                    ready = []
                started = time.monotonic()
                outcome = self._run(attempt, resolved)
                if on_job_ran is not None:
                    on_job_ran(time.monotonic() - started)
                if isinstance(outcome, Success):
                    ready.append(outcome)
                else:
                    statuses[attempt.job.id] = outcome
                    self._release_held(attempt.job.id)
            if ready:
                statuses.update(self._commit_successes(ready))
        finally:  # after an error too: no job of the batch stays held (and heartbeated) here
            for attempt, _ in prepared:
                self._release_held(attempt.job.id)
        return statuses

    def _lock_and_prepare(self, ids):
        """The batch's lock and RESOLVE: [(attempt, Resolved or JobFailure)], each held. A lock
        that found the store unreachable may have committed all the same (its answer lost with
        the connection): its ids are remembered, and a later lock of them adopts those this
        worker holds (execution/unheard_locks.py)."""
        with self._held_lock:
            adopt = self.unheard_locks.begin(ids, self.held)
        locked = None
        try:
            with self._unit():
                locked = self.lifecycle.lock_jobs(
                    ids, self.instance_id, self.lock_ttl_ms, adopt=adopt
                )
                return self._prepare_locked(locked, adopt)
        except Exception as exc:
            if locked is None and self.store.is_unreachable(exc):  # the lock went unheard
                with self._held_lock:
                    self.unheard_locks.lost(ids, self.held)
            raise
        finally:
            with self._held_lock:
                self.unheard_locks.end(ids)

    def _prepare_locked(self, locked, adopt):
        prepared = []
        try:
            for job, snapshot in locked:
                adopted = job.id in adopt
                if adopted:
                    log_event(
                        'job.lock_adopted', logging.WARNING, job_id=job.id, worker=self.instance_id
                    )
                prepared.append(self._prepare(job, snapshot, defer_success=True, adopted=adopted))
        except BaseException:
            for job, _ in locked:
                self._release_held(job.id)
            raise
        return prepared

    def _prepare(self, job, snapshot, defer_success=False, adopted=False):
        """A locked job becomes an Attempt held by this worker (the supervisor heartbeats it from
        now on) and is RESOLVEd: returns (attempt, Resolved or the JobFailure that stopped it)."""
        try:
            definition = self.registry.get(job.job_type)
        except UnknownJobTypeError:
            definition = None
        attempt = Attempt(job, definition, Fence(self.instance_id, job.attempt_no), snapshot)
        if job.attempt_no == 1 and job.started_at is not None:
            wait_s = (job.started_at - job.created_at).total_seconds()
            self.signals.job_started(job.job_type, job.queue_name, wait_s)
        attempt.retries_used = job.retry_count
        attempt.defer_success = defer_success
        attempt.adopted = adopted
        with self._held_lock:
            self.held[job.id] = attempt
        try:
            resolved = self._resolve(attempt)
        except JobFailure as failure:  # no definition here, credentials, routing
            resolved = failure
        except BaseException:
            self._release_held(job.id)
            raise
        return attempt, resolved

    def _commit_successes(self, ready):
        """The final writes of ``ready`` (each a completion.Success) in one group commit. A job
        whose work failed there goes on exactly as ``execute`` would after that PROJECT
        transaction failed (its work was rolled back, the others' committed). Returns
        {job id: status}."""
        outcomes = self.completion.commit_group(ready)
        statuses = {}
        for success, outcome in zip(ready, outcomes, strict=True):
            a = success.attempt
            if outcome is None:
                statuses[a.job.id] = self.completion.complete(a, SUCCEEDED, None)
            elif self.store.is_unreachable(outcome):
                statuses[a.job.id] = self._run(a, success.resolved, success.write_alone)
            else:
                statuses[a.job.id] = self._run(
                    a, success.resolved, lambda s=success, exc=outcome: self._resume(s, exc)
                )
            self._release_held(a.job.id)
        return statuses

    def _resume(self, success, exc):
        """After ``success``'s PROJECT work raised ``exc`` in a group: its usage row, then on
        as ``_run_attempts`` goes on after a failed projection (a retry, or the failure)."""
        a, resolved = success.attempt, success.resolved
        a.defer_success = False  # from here on, this job writes alone
        try:
            self._until_written(a, lambda: self.completion.projection_failed(*success.args, exc))
        except JobCancelledError:
            raise
        except JobFailure as failure:
            return self._run_attempts(a, resolved, failure)

    def _release_held(self, job_id):
        with self._held_lock:
            self.held.pop(job_id, None)

    def _run(self, a, resolved, step=None):
        """Run ``step()`` (by default: every attempt of the provider call and what follows) and
        turn how it ended into the job's terminal write; returns the status reached, None when
        the attempt was abandoned, or a completion.Success whose write the caller commits."""
        try:
            return self._run_to_end(a, resolved, step)
        except (AttemptAbandoned, JobLockConflictError, IllegalTransitionError) as exc:
            # The lock was lost, the worker stops, or another holder finished the job, found
            # by the step or by the terminal write after it: this attempt writes nothing more.
            log_event(
                'job.abandoned',
                logging.WARNING,
                job_id=a.job.id,
                worker=self.instance_id,
                reason=str(exc),
            )
            return None

    def _run_to_end(self, a, resolved, step):
        try:
            if isinstance(resolved, JobFailure):  # RESOLVE failed
                return self.completion.fail(a, resolved)
            if step is not None:
                return step()
            return self._run_attempts(a, resolved)
        except JobCancelledError:
            if a.abandoned:
                return None
            return self.completion.finish_cancelled(a)
        except JobFailure as failure:
            return self.completion.fail(a, failure)

    # ------------------------------------------------------------ RESOLVE
    def _resolve(self, a):
        if a.definition is None:
            raise MisconfiguredJobError(
                'jobType %s is not registered here' % a.job.job_type,
                code='INTERNAL_UNKNOWN_JOB_TYPE',
            )
        if a.snapshot is None:
            raise MisconfiguredJobError(
                'job %s has no input snapshot' % a.job.id, code='INTERNAL_SNAPSHOT_MISSING'
            )
        credential = self.ai.credentials.resolve(a.job)
        provider, model = self.ai.gateway.route(a.definition, a.job)
        projector = self.ai.projectors.for_definition(a.definition)
        return Resolved(a.snapshot['input'], credential, provider, model, projector)

    # ------------------------------------------------------------ EXECUTE, with retries
    def _run_attempts(self, a, resolved, failure=None):
        """Provider calls until one succeeds and is projected, or the retries run out.
        ``failure``: go on after a call whose projection failed in a group commit, as if
        that call had just failed here."""
        if failure is None:
            if a.definition.security.content_safety_check:
                self.ai.safety.check(resolved.input, 'input')  # once: the input cannot change
            a.retries_used = a.job.retry_count
        # The lock's own row just said: no cancel requested (not so for an adopted lock's).
        fresh_lock = failure is None and not a.adopted
        while True:
            if failure is None:
                self._check_cancel(a, read_store=not fresh_lock)
                fresh_lock = False
                try:
                    output, usage, latency_ms, call = self.calls.call(
                        a, resolved, a.retries_used + 1
                    )
                    args = (a, resolved, output, usage, latency_ms, call)
                    if a.defer_success:  # the caller commits it with others (execute_batch)
                        return Success(self.completion, *args)
                    return self.completion.project(*args)
                except JobCancelledError:
                    raise
                except JobFailure as exc:
                    failure = exc
                except JobDeferred as deferral:
                    return self._defer(a, deferral)
            abort_strategy = a.definition.execution.abort_strategy
            if (
                not failure.may_retry(abort_strategy, a.internal_retries)
                or a.retries_used >= a.job.max_retry_count
            ):
                return self.completion.fail(a, failure)
            delay_s = a.definition.execution.retry_backoff.delay_ms(a.retries_used + 1) / 1000.0
            delay_s = max(delay_s, failure.retry_after_s or 0)
            log_event(
                'job.retry_scheduled',
                job_id=a.job.id,
                call=a.retries_used + 1,
                error_code=failure.code,
                delay_s=round(delay_s, 2),
            )
            self.signals.job_retried(a.job.job_type, failure.code)
            # Counted (and written to the history) when scheduled, so the backoff shows.
            schedule = functools.partial(
                self.lifecycle.count_retry,
                a.job.id,
                a.fence,
                retry_no=a.retries_used + 1,
                error=failure,
                backoff_ms=delay_s * 1000,
            )
            self._until_written(a, schedule)
            a.retries_used += 1
            a.internal_retries += isinstance(failure, InternalJobError)
            failure = None
            self._wait(a, delay_s)

    def _defer(self, a, deferral):
        """A guard said wait (JobDeferred): hand the job back until its wake time, holding no
        thread and spending no retry (lifecycle.defer); the wake-up pushes it again."""
        delay_ms = int(deferral.delay_s * 1000)
        waker = self.waker
        defer = functools.partial(
            self.lifecycle.defer,
            a.job.id,
            a.fence,
            delay_ms,
            deferral.reason,
            deferral.detail,
            wake_by=self.instance_id if waker is not None else None,
        )
        event = self._until_written(a, defer)
        self._release_held(a.job.id)  # no lock left to extend: the supervisor lets it be
        if waker is not None:
            waker.schedule(event, deferral.delay_s)
        self.signals.job_deferred(a.job.job_type, deferral.reason)
        log_event(
            'job.deferred',
            job_id=a.job.id,
            reason=deferral.reason,
            delay_ms=delay_ms,
            attempt=a.job.attempt_no,
        )
        return DEFERRED

    # ------------------------------------------------------------ cancels and backoff
    def _wait(self, a, seconds):
        """Backoff sleep that a cancel (or the worker stopping) cuts short."""
        if a.cancel_event.wait(seconds):
            a.stop_if_told()

    def _check_cancel(self, a, read_store=True):
        """Before each provider call: the in-process flag, then the database (the truth)."""
        a.stop_if_told()
        if not read_store:
            return
        try:
            with self._unit():
                requested = (
                    AiJob.select(AiJob.cancel_requested_at).where(AiJob.id == a.job.id).scalar()
                )
        except Exception as exc:  # the store is down: the flag and the fast path still work
            if not self.store.is_unreachable(exc):
                raise
            return
        if requested is not None:
            a.cancel_event.set()
            raise JobCancelledError('cancel requested')

    # ------------------------------------------------------------ for the supervisor
    def held_attempts(self):
        with self._held_lock:
            return list(self.held.values())

    def holds(self, attempt):
        """Is ``attempt`` still running here (not finished since the supervisor listed it)?"""
        with self._held_lock:
            return self.held.get(attempt.job.id) is attempt


class _NoConnection:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_CONNECTION = _NoConnection()


def _no_connection():
    return _NO_CONNECTION
