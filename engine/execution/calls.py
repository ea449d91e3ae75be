"""EXECUTE's one provider call (contracts §5): the request, the call held by the configured
guards (providers.CallGuard) and moved along the job's route while a guard finds an entry
unavailable, the output's checks, and the call's usage row. Every call leaves a usage row: a
failed one here, in a transaction of its own; a successful one in PROJECT's transaction
(completion.py), through ``log_usage``."""

import logging
import time
from decimal import Decimal

from ..core.errors import (
    AiJobError,
    InternalJobError,
    JobDeferred,
    JobFailure,
    OutputValidationError,
)
from ..core.history import progress_milestone
from ..core.logs import log_event
from ..core.registry import first_error
from .attempt import LOCK_LOST, AttemptAbandoned, ms_since
from .providers import CallContext, EntryUnavailable, ProviderRequest, Usage
from .usage import record_usage


class ProviderCalls:
    """The provider calls of the jobs one engine runs. ``unit()`` is a unit of database work on
    the thread's connection, ``until_written`` the engine's write that waits out an outage."""

    def __init__(self, store, lifecycle, ai, live_text, unit, until_written, signals):
        self.store = store
        self.lifecycle = lifecycle
        self.ai = ai
        self.live_text = live_text  # who follows the text of provider calls (Hooks.live_text)
        self.unit = unit
        self.until_written = until_written
        self.signals = signals  # each call's outcome, time, tokens and cost (core/signals.py)

    def call(self, a, resolved, call_no):
        """One provider call: generate within the deadline, validate, safety on output. Returns
        (output, usage, latency_ms, call): ``call`` is the ProviderCall, which names the provider
        and model that answered. A call that fails has its usage row written here."""
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
                self.log_usage_now(a, call, usage, started, LOCK_LOST)
            a.stop_if_told()
            validate_output(definition, result.output)
            if definition.security.content_safety_check:
                self.ai.safety.check(result.output, 'output')
            return result.output, result.usage, ms_since(started), call
        except JobFailure as failure:
            call = failure.call = getattr(failure, 'call', call)
            usage = usage or getattr(failure, 'usage', None)
            if a.abandoned:
                self.log_usage_now(a, call, usage, started, LOCK_LOST)
                raise AttemptAbandoned(a.job.id) from None
            self.log_usage_now(a, call, usage, started, failure.code)
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
        to each follower of the live text (a job's live stream) through a sink of its own: each
        call (a retry, a fallback) is a new attempt of that text. The sinks are closed, their
        last text sent, before the call's outcome is written, so a stream shows the whole text
        before the job's end. With no follower, nothing is opened."""
        started = time.monotonic()
        usage, error_code = None, 'INTERNAL_PROVIDER_ERROR'
        if self.live_text:
            ctx.text_sinks = tuple(live.open(call.request.job_id) for live in self.live_text)
        try:
            call.sent = True
            result = call.provider.generate(call.request, ctx)
            usage, error_code = result.usage, None
            return result
        except AiJobError as exc:
            usage, error_code = getattr(exc, 'usage', None), exc.code
            raise
        finally:
            for sink in ctx.text_sinks:
                sink.close()
            ctx.text_sinks = ()
            # The cost only for a receiver: the usage row computes its own (log_usage).
            cost = self.cost(call, usage) if usage and self.signals.receivers else None
            self.signals.provider_call(
                call.provider_key, call.model, error_code, time.monotonic() - started, usage, cost
            )

    def cost(self, call, usage):
        """What ``call`` cost with ``usage``: nothing when the response cache answered it, else
        its usage at its provider and model's price (usage.call_cost)."""
        if call.cached:
            return Decimal(0)
        return self.ai.pricing.cost(call.provider_key, call.model, usage)

    def log_usage_now(self, a, call, usage, started, error_code):
        """The usage row of a call that did not succeed, in a transaction of its own (with
        what the guards settle for it)."""
        latency_ms = ms_since(started)

        def write():
            if not self.ai.guards:
                return self.log_usage(a, call, usage, latency_ms, error_code)
            return self.store.run_in_transaction(
                lambda tx: self.log_usage(a, call, usage, latency_ms, error_code)
            )

        self.until_written(a, write)

    def log_usage(self, a, call, usage, latency_ms, error_code):
        """The call's ai_usage_log row, on the caller's connection and in its transaction, and
        what each guard settles for the call with it."""
        usage = usage or Usage()
        cost = self.cost(call, usage)
        record_usage(
            a.job,
            call.call_no,
            call.provider_key,
            call.model,
            usage,
            cost,
            latency_ms,
            error_code,
            call.cached,
        )
        for guard in self.ai.guards:
            guard.settle(call, usage, cost, error_code)

    def _set_progress(self, a, percent):
        percent = max(0, min(100, int(percent)))
        milestone = progress_milestone(percent)
        try:
            with self.unit():
                self.lifecycle.set_progress(
                    a.job.id, a.fence, percent, milestone=milestone > a.milestone
                )
            a.milestone = max(a.milestone, milestone)
        except Exception as exc:  # progress is a hint: an outage must not fail the call
            if not self.store.is_unreachable(exc):
                raise


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
