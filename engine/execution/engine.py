"""AiJobExecutionEngine (contracts §5): runs one job through PREPARE, RESOLVE, EXECUTE, PROJECT and
COMPLETE.

Retries happen here, with the definition's backoff, and never by queue redelivery (contracts §5.5):
a message is acknowledged once the engine is done with the job, whatever the outcome. Every write is
fenced by the lock this worker took (architecture decision 3); losing it mid-way abandons the
attempt without writing anything.
"""

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal

from ..core import metrics
from ..core.errors import (
    AiJobError,
    FinishWrittenError,
    IllegalTransitionError,
    InternalJobError,
    JobCancelledError,
    JobDeferred,
    JobFailure,
    JobLockConflictError,
    JobNotFoundError,
    MisconfiguredJobError,
    OutputValidationError,
    UnknownJobTypeError,
)
from ..core.groupcommit import GroupCommit
from ..core.history import progress_milestone
from ..core.lifecycle import CANCELLED, FAILED, SUCCEEDED, Fence
from ..core.logs import log_event
from ..core.models import AiJob, canonical_hash
from ..core.registry import first_error
from .providers import CallContext, EntryUnavailable, ProviderRequest, Usage
from .unheard_locks import UnheardLocks
from .usage import record_usage

# Waits between tries of a job's final write while the store is unreachable.
STORE_RETRY_FIRST_S = 0.2
STORE_RETRY_MAX_S = 1.0
# The error code of a usage row whose call finished after its worker lost the lock or stopped.
LOCK_LOST = 'INTERNAL_ATTEMPT_ABANDONED'
# What ``execute`` returns for a job handed back until its wake time (lifecycle.defer): not a
# terminal status, but the worker is done with the message.
DEFERRED = 'deferred'


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
    defer_success: bool = False  # a success returns a _Success for the caller to commit
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


class _Success:
    """A job whose provider call succeeded and whose PROJECT transaction is still to commit:
    ``work`` is that transaction's work, for a group commit; ``write_alone`` writes it in a
    transaction of its own (``execute``'s path, refusals included)."""

    def __init__(self, engine, a, resolved, output, usage, latency_ms, call):
        self.attempt = a
        self.resolved = resolved
        self.args = (a, resolved, usage, latency_ms, call)  # for _projection_failed
        self.ready_at = time.monotonic()
        self.work = engine._projection(a, resolved, output, usage, latency_ms, call)
        self.write_alone = lambda: engine._project(a, resolved, output, usage, latency_ms, call)


@dataclass
class Resolved:
    """What RESOLVE found for a job."""

    input: dict
    credential: object
    provider: object
    model: str
    projector: object


class ExecutionEngine:
    def __init__(self, runtime, instance_id):
        self.store = runtime.store
        self.registry = runtime.registry
        self.lifecycle = runtime.lifecycle
        self.ai = runtime.ai
        self.instance_id = instance_id
        self.lock_ttl_ms = runtime.config.lock_ttl_ms
        # Where a terminal UPDATE's refusal is the server's error (Store.guards_row_counts), a
        # group's writes carry its COMMIT: one round trip for the whole finish.
        self.group_commit = GroupCommit(self.store, commit_with_rows=self.store.guards_row_counts)
        # Pushes deferred jobs' wake-ups at their time (dispatch.wake.Waker, set by the Worker);
        # without one the leader's dispatcher pushes them from the outbox when they are due.
        self.waker = None
        self.text = runtime.text_pump  # the live text of provider calls (execution/deltas.py)
        self.held = {}  # job id -> Attempt, watched by the supervisor
        self._held_lock = threading.Lock()
        self.unheard_locks = UnheardLocks()  # guarded by _held_lock too
        # A unit of database work on this thread's connection. A pooled database (MySQL) gives
        # the connection back to the pool at the end of each unit; SQLite has no pool to share
        # and reopening its file costs more than the statements, so each thread keeps its own.
        self._unit = self.store.connection if self.store.dialect == 'mysql' else _no_connection

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
        """``execute`` for several jobs popped together: one lock statement for all of them,
        then each run in turn on this thread; the final writes of the jobs that succeed are
        committed together (with other threads' through group commit) once the batch is done
        or ``flush_after_s`` after the first was ready. Returns {job id: status} (None as in
        ``execute``; jobs this call could not lock are left out). ``on_job_ran(seconds)`` hears
        how long each job ran, its lock and final commit left out."""
        statuses = {}
        prepared = self._lock_and_prepare(list(dict.fromkeys(job_ids)))
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
                if isinstance(outcome, _Success):
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
            metrics.job_started(job.job_type, job.queue_name, wait_s)
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
        """The final writes of ``ready`` (each a _Success) in one group commit. A job whose
        work failed there goes on exactly as ``execute`` would after that PROJECT transaction
        failed (its work was rolled back, the others' committed). Returns {job id: status}."""
        try:
            with self._unit():
                outcomes = self.group_commit.run([success.work for success in ready])
        except Exception as exc:  # no connection to be had: each job waits out the outage alone
            if not self.store.is_unreachable(exc):
                raise
            outcomes = [exc] * len(ready)
        statuses = {}
        for success, outcome in zip(ready, outcomes, strict=True):
            a = success.attempt
            if outcome is None:
                statuses[a.job.id] = self._complete(a, SUCCEEDED, None)
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
            self._until_written(a, lambda: self._projection_failed(*success.args, exc))
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
        the attempt was abandoned, or a _Success whose write the caller commits."""
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
                return self._fail(a, resolved)
            if step is not None:
                return step()
            return self._run_attempts(a, resolved)
        except JobCancelledError:
            if a.abandoned:
                return None
            return self._finish_cancelled(a)
        except JobFailure as failure:
            return self._fail(a, failure)

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
                    output, usage, latency_ms, call = self._call(a, resolved, a.retries_used + 1)
                    args = (a, resolved, output, usage, latency_ms, call)
                    if a.defer_success:  # the caller commits it with others (execute_batch)
                        return _Success(self, *args)
                    return self._project(*args)
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
                return self._fail(a, failure)
            delay_s = a.definition.execution.retry_backoff.delay_ms(a.retries_used + 1) / 1000.0
            delay_s = max(delay_s, failure.retry_after_s or 0)
            log_event(
                'job.retry_scheduled',
                job_id=a.job.id,
                call=a.retries_used + 1,
                error_code=failure.code,
                delay_s=round(delay_s, 2),
            )
            metrics.job_retried(a.job.job_type, failure.code)
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
        metrics.job_deferred(a.job.job_type, deferral.reason)
        log_event(
            'job.deferred',
            job_id=a.job.id,
            reason=deferral.reason,
            delay_ms=delay_ms,
            attempt=a.job.attempt_no,
        )
        return DEFERRED

    def _call(self, a, resolved, call_no):
        """One provider call: generate within the deadline, validate, safety on output. Every
        call leaves a usage row: a failed one here, a successful one in PROJECT's transaction.
        Returns (output, usage, latency_ms, call): ``call`` is the ProviderCall, which names the
        provider and model that answered."""
        definition = a.definition
        ctx = CallContext(
            deadline=time.monotonic() + definition.execution.timeout_ms / 1000.0,
            cancel_event=a.cancel_event,
            on_progress=lambda pct: self._set_progress(a, pct),
        )
        request = ProviderRequest(
            job_id=a.job.id,
            job_type=a.job.job_type,
            attempt=call_no,
            input=resolved.input,
            definition=definition,
            credential=resolved.credential,
            model=resolved.model,
            prompt_version=a.job.prompt_version,
            overrides=(a.snapshot or {}).get('overrides') or {},
        )
        call = self.ai.gateway.prepare_call(a, resolved, request)
        request.model = call.model
        started = time.monotonic()
        usage = None
        try:
            try:
                result, call = self._guarded(a, call, ctx)
            except (AiJobError, JobDeferred):
                raise
            except Exception as exc:  # a provider bug must not kill the worker
                # its type and frames, never its message (logs.JsonFormatter): to find the bug
                log_event(
                    'job.provider_internal_error', logging.WARNING, exc_info=exc, job_id=a.job.id
                )
                raise InternalJobError(
                    'provider raised %s' % exc.__class__.__name__, code='INTERNAL_PROVIDER_ERROR'
                ) from exc
            usage = result.usage
            if a.abandoned:  # the lock went while the call ran: its cost was incurred all the same
                self._log_usage_now(a, call, usage, started, LOCK_LOST)
            a.stop_if_told()
            validate_output(definition, result.output)
            if definition.security.content_safety_check:
                self.ai.safety.check(result.output, 'output')
            return result.output, result.usage, _ms_since(started), call
        except JobFailure as failure:
            call = failure.call = getattr(failure, 'call', call)
            usage = usage or getattr(failure, 'usage', None)
            if a.abandoned:
                self._log_usage_now(a, call, usage, started, LOCK_LOST)
                raise AttemptAbandoned(a.job.id) from None
            self._log_usage_now(a, call, usage, started, failure.code)
            raise

    def _guarded(self, a, call, ctx):
        """``_guarded_entry`` on the call's route entry, then on the next one for as long as a
        guard finds an entry unavailable; with no entry left, the job is deferred. Returns
        (result, the call that answered); an exception carries its call as ``exc.call``."""
        while True:
            try:
                return self._guarded_entry(call, ctx), call
            except EntryUnavailable as unavailable:
                following = self.ai.gateway.next_entry(a, call, unavailable)
                if following is None:
                    deferral = unavailable.deferral()
                    deferral.call = call
                    raise deferral from None
                call = following
            except BaseException as exc:
                exc.call = call
                raise

    def _guarded_entry(self, call, ctx):
        """The provider call held by the configured guards (providers.CallGuard): each guard's
        ``before`` in order (a guard may answer the call itself, or defer or fail it), the call,
        then ``after`` for every guard whose ``before`` returned, however the call ended."""
        passed = []
        try:
            result = None
            for guard in self.ai.guards:
                result = guard.before(call)
                passed.append(guard)
                if result is not None:
                    # A guard answered: the response cache (no cost), or a provider batch's
                    # line, which the provider billed at its batch price.
                    call.cached = not result.usage.batch
                    break
            if result is None:
                result = self._generate(call, ctx)
        except BaseException as exc:
            for guard in passed:
                guard.after(call, getattr(exc, 'usage', None), exc)
            raise
        call.result = result
        for guard in passed:
            guard.after(call, result.usage, None)
        return result

    def _generate(self, call, ctx):
        """The provider call itself, timed and counted for the metrics. The text it streams goes
        to the job's live stream through a sink of its own: each call (a retry, a fallback) is a
        new attempt of that text. The sink is closed, its last text sent, before the call's
        outcome is written, so a stream shows the whole text before the job's end."""
        started = time.monotonic()
        usage, error_code = None, 'INTERNAL_PROVIDER_ERROR'
        ctx.text_sink = self.text.open(call.request.job_id)
        try:
            call.sent = True
            result = call.provider.generate(call.request, ctx)
            usage, error_code = result.usage, None
            return result
        except AiJobError as exc:
            usage, error_code = getattr(exc, 'usage', None), exc.code
            raise
        finally:
            ctx.text_sink.close()
            ctx.text_sink = None
            key = call.provider_key
            cost = self.ai.pricing.cost(key, call.model, usage) if usage else None
            metrics.provider_call(
                key, call.model, error_code, time.monotonic() - started, usage, cost
            )

    def _log_usage_now(self, a, call, usage, started, error_code):
        """The usage row of a call that did not succeed, in a transaction of its own (with
        what the guards settle for it)."""
        latency_ms = _ms_since(started)

        def write():
            if not self.ai.guards:
                return self._log_usage(a, call, usage, latency_ms, error_code)
            return self.store.run_in_transaction(
                lambda tx: self._log_usage(a, call, usage, latency_ms, error_code)
            )

        self._until_written(a, write)

    def _set_progress(self, a, percent):
        percent = max(0, min(100, int(percent)))
        milestone = progress_milestone(percent)
        try:
            with self._unit():
                self.lifecycle.set_progress(
                    a.job.id, a.fence, percent, milestone=milestone > a.milestone
                )
            a.milestone = max(a.milestone, milestone)
        except Exception as exc:  # progress is a hint: an outage must not fail the call
            if not self.store.is_unreachable(exc):
                raise

    def _until_written(self, a, write):
        """Run ``write`` in a unit of database work, again while the store is unreachable: the
        job stays this worker's through an outage (its heartbeats resume with the store), and
        its result is written when the store returns instead of being dropped. Gives up only
        when the attempt is abandoned (its lock was lost, or the worker stops). A terminal
        write whose try before committed, though its answer was lost, is done."""
        delay_s = STORE_RETRY_FIRST_S
        while True:
            try:
                with self._unit():
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

    # ------------------------------------------------------------ PROJECT
    def _project(self, a, resolved, output, usage, latency_ms, call):
        self._until_written(
            a, lambda: self._project_in_unit(a, resolved, output, usage, latency_ms, call)
        )
        return self._complete(a, SUCCEEDED, None)

    def _projection(self, a, resolved, output, usage, latency_ms, call):
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
            self._log_usage(a, call, usage, latency_ms, None)

        return work

    def _project_in_unit(self, a, resolved, output, usage, latency_ms, call):
        work = self._projection(a, resolved, output, usage, latency_ms, call)
        try:
            self.store.run_in_transaction(work)
        except Exception as exc:
            self._projection_failed(a, resolved, usage, latency_ms, call, exc)

    def _projection_failed(self, a, resolved, usage, latency_ms, call, exc):
        """A PROJECT transaction raised ``exc`` and rolled back: record its call's usage as
        it stands, and raise what the job goes on with."""
        if isinstance(exc, FinishWrittenError):  # committed, with its usage row, before
            raise exc
        if isinstance(exc, JobCancelledError):  # a cancel request beat the success write
            self._log_usage(a, call, usage, latency_ms, None)
            raise exc
        if isinstance(exc, (JobLockConflictError, IllegalTransitionError)):
            # A zombie (its lock taken, or its job finished by the new holder): its result
            # goes, its cost stays.
            self._log_usage(a, call, usage, latency_ms, LOCK_LOST)
            raise exc
        if isinstance(exc, JobFailure):
            raise exc
        if self.store.is_unreachable(exc):
            raise exc  # not the projection's fault: written again when the store returns
        self._log_usage(a, call, usage, latency_ms, 'INTERNAL_PROJECTION_FAILED')
        raise InternalJobError(
            'projection failed: %s' % exc.__class__.__name__, code='INTERNAL_PROJECTION_FAILED'
        ) from exc

    # ------------------------------------------------------------ COMPLETE
    def _fail(self, a, failure):
        self._until_written(a, lambda: self.lifecycle.mark_failed(a.job.id, failure, fence=a.fence))
        return self._complete(a, FAILED, failure.code)

    def _finish_cancelled(self, a):
        self._until_written(a, lambda: self.lifecycle.mark_cancelled(a.job.id, fence=a.fence))
        return self._complete(a, CANCELLED, 'CANCELLED')

    def _complete(self, a, status, error_code):
        metrics.job_finished(a.job.job_type, a.job.queue_name, status, time.monotonic() - a.started)
        log_event(
            'job.finished',
            job_id=a.job.id,
            job_type=a.job.job_type,
            status=status,
            error_code=error_code,
            attempt=a.job.attempt_no,
            retries=a.retries_used,
            run_ms=_ms_since(a.started),
        )
        return status

    def _log_usage(self, a, call, usage, latency_ms, error_code):
        """The call's ai_usage_log row, on the caller's connection and in its transaction, and
        what each guard settles for the call with it."""
        usage = usage or Usage()
        key = call.provider_key
        cost = Decimal(0) if call.cached else self.ai.pricing.cost(key, call.model, usage)
        record_usage(
            a.job, call.call_no, key, call.model, usage, cost, latency_ms, error_code, call.cached
        )
        for guard in self.ai.guards:
            guard.settle(call, usage, cost, error_code)

    # ------------------------------------------------------------ for the supervisor
    def held_attempts(self):
        with self._held_lock:
            return list(self.held.values())

    def holds(self, attempt):
        """Is ``attempt`` still running here (not finished since the supervisor listed it)?"""
        with self._held_lock:
            return self.held.get(attempt.job.id) is attempt


def validate_output(definition, output):
    """The job succeeds only with a JSON object that satisfies the definition's validator."""
    if not isinstance(output, dict):
        raise OutputValidationError(
            'output is %s, not an object' % type(output).__name__, code='VALIDATION_NOT_OBJECT'
        )
    schema = definition.output.validator
    if schema is None:
        return
    error = first_error(schema, output)
    if error is not None:
        path = '/'.join(str(p) for p in error.absolute_path) or '(root)'
        raise OutputValidationError('output invalid at %s: %s' % (path, error.validator))


def _ms_since(started):
    return int((time.monotonic() - started) * 1000)


class _NoConnection:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_CONNECTION = _NoConnection()


def _no_connection():
    return _NO_CONNECTION
