"""The AI gateway: the provider contract the engine calls, the call context that carries the
deadline and cancellation into a provider, and the offline synthetic provider.

A provider only *classifies*: it turns every failure into a JobFailure of contracts §5.2 (code and
retryability); the engine owns retries, timeouts and cancellation decisions.
"""

import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from ..core.errors import (
    ConfigError,
    JobCancelledError,
    JobDeferred,
    JobTimeoutError,
    MisconfiguredJobError,
)


@dataclass(frozen=True)
class Credential:
    """The key a call runs with. ``api_key`` never leaves the process: not logged, not stored
    in clear, not put in Redis; ``repr`` hides it."""

    mode: str  # platform_key | user_deepseek_key
    api_key: Optional[str] = field(default=None, repr=False)
    credential_id: Optional[str] = None
    # A user's key: the provider it was registered for (where its job may fall back).
    provider: Optional[str] = field(default=None, compare=False)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, served from the provider's prompt cache
    batch: bool = False  # billed at the provider's batch rate (usage.Price.batch)
    batch_id: Optional[str] = None  # the ai_provider_batch that answered the call


@dataclass
class ProviderRequest:
    job_id: str
    job_type: str
    attempt: int  # 1 = first call for this job, 2 = first retry, …
    input: dict  # the snapshot's validated input; never logged
    definition: object  # the JobDefinition
    credential: Credential
    model: Optional[str] = None
    prompt_version: Optional[str] = None
    max_tokens: Optional[int] = None  # the completion cap to send, when the route entry has one
    overrides: dict = field(default_factory=dict)  # the job's create-time overrides (noCache)


@dataclass
class ProviderResult:
    output: dict
    usage: Usage = field(default_factory=Usage)
    model: str = ''


class CallContext:
    """What a running attempt may ask of the engine: how long it has left, whether it was
    cancelled, progress and live-text reports, and a sleep that wakes up on cancellation or the
    deadline."""

    def __init__(self, deadline, cancel_event=None, on_progress=None, clock=time.monotonic):
        self.deadline = deadline  # a time.monotonic() value
        self.cancel_event = cancel_event or threading.Event()
        self._on_progress = on_progress
        self._clock = clock
        # The live-text sinks of the provider call now running (Hooks.live_text), set by the
        # engine around each call; empty: nobody follows the text.
        self.text_sinks = ()

    def remaining_s(self):
        return max(0.0, self.deadline - self._clock())

    def is_cancelled(self):
        return self.cancel_event.is_set()

    def check(self):
        """Raise JobCancelledError or JobTimeoutError if the attempt must stop now."""
        if self.cancel_event.is_set():
            raise JobCancelledError('cancel requested')
        if self._clock() >= self.deadline:
            raise JobTimeoutError('deadline passed')

    def sleep(self, seconds):
        """Sleep up to ``seconds``; raise at once on cancellation or at the deadline."""
        self.check()
        wait = min(seconds, self.remaining_s())
        if self.cancel_event.wait(wait):
            raise JobCancelledError('cancel requested')
        if wait < seconds:
            raise JobTimeoutError('deadline passed')

    def report_progress(self, percent):
        if self._on_progress is not None:
            self._on_progress(max(0, min(99, int(percent))))

    def report_text(self, text):
        """A streaming provider reports each piece of generated text as it arrives; the engine
        forwards it to the job's live stream. It must never be logged or stored."""
        if text:
            for sink in self.text_sinks:
                sink.write(text)


@dataclass
class ProviderCall:
    """One provider call the engine is about to make for a job: which provider and model it goes
    to (the gateway picks them, a route entry at a time) and each guard's own state for it.
    The usage row of the call names ``provider_key`` and ``model``."""

    job: object  # the AiJob as the lock read it
    definition: object
    request: ProviderRequest
    provider: object  # the Provider
    model: str
    call_no: int
    notes: dict = field(default_factory=dict)  # per guard: its reservations for this call
    cached: bool = False  # answered by the response cache: no provider was called
    sent: bool = False  # the request went to the provider (every guard's ``before`` let it)
    # What the gateway knows of the route entry (None or 0 where nothing is configured):
    max_tokens: Optional[int] = None  # the completion cap sent with the request
    prompt_tokens: int = 0  # the estimated prompt tokens of the rendered request
    prompt_token_bound: Optional[int] = None  # the most they can count (openai_client)
    price: object = None  # usage.Price of this provider/model
    limits: object = None  # the entry's rate limits (rpm, tpm), or None
    has_next_entry: bool = False  # may the route move on to another entry?
    result: Optional[ProviderResult] = None  # what answered the call, once it has answered

    @property
    def provider_key(self):
        return self.provider.key or ''

    @property
    def entry_key(self):
        """'provider/model': how configuration, cooldowns, limits and metrics name the entry."""
        return '%s/%s' % (self.provider_key, self.model)


class EntryUnavailable(Exception):
    """A guard's ``before`` says this call's route entry cannot take the call now (its rate
    limit is used up for ``delay_s``): the gateway moves the call to the route's next entry,
    and when there is none the job is deferred (JobDeferred) for ``delay_s``."""

    def __init__(self, delay_s, reason, detail=None):
        super().__init__('%s: entry unavailable for %.3f s' % (reason, delay_s))
        self.delay_s = delay_s
        self.reason = reason
        self.detail = dict(detail or {})

    def deferral(self):
        return JobDeferred(self.delay_s, self.reason, self.detail)


class CallGuard:
    """A rule held around every provider call (rate limits, budgets, the response cache). The
    engine runs each configured guard, in order, around each call:

    - ``before(call)`` before the call: reserve what the call may use. Raise JobDeferred (the job
      waits), or a JobFailure (it fails or retries); return a ProviderResult to answer the call
      without a provider (a cache hit: the guards after it are skipped);
    - ``after(call, usage, failure)`` once the call is over or will not be made, outside any
      transaction: ``usage`` (providers.Usage or None) is what it used, ``failure`` the exception
      that ended it (a JobFailure or JobDeferred) or None. Every guard whose ``before`` returned
      hears ``after`` exactly once;
    - ``settle(call, usage, cost, error_code)`` inside the transaction that writes the call's
      usage row (the success's PROJECT transaction, or the failed call's own), so that what a
      guard records commits with that row or not at all.

    With no guard configured the engine's path is what it was: the list is empty."""

    def before(self, call):
        return None

    def after(self, call, usage, failure):
        pass

    def settle(self, call, usage, cost, error_code):
        pass


class Provider:
    """One AI backend. ``generate`` returns a ProviderResult whose ``output`` is a dict, or
    raises a JobFailure; it must return promptly once ``ctx`` says cancelled or out of time."""

    key = None

    def generate(self, request, ctx):
        raise NotImplementedError


class AiGateway:
    """Providers by key, and the routing of a job to one of them (ModelRouter)."""

    def __init__(self, providers=(), default_provider='synthetic'):
        self._providers = {}
        self.default_provider = default_provider
        for provider in providers:
            self.add(provider)

    def add(self, provider):
        self._providers[provider.key] = provider

    def providers(self):
        """Every provider added so far (the plugins' own among them)."""
        return list(self._providers.values())

    def provider_for(self, definition):
        """The provider a definition runs on, or None when this process has none configured."""
        return self._providers.get(definition.provider or self.default_provider)

    def route(self, definition, job):
        """(provider, model) for a job: the definition's provider, else the default."""
        provider = self.provider_for(definition)
        if provider is None:
            key = definition.provider or self.default_provider
            raise MisconfiguredJobError(
                'no provider %r configured' % key, code='INTERNAL_PROVIDER_MISSING'
            )
        return provider, getattr(provider, 'model', None) or provider.key

    def platform_available(self, definition, platform_key_configured):
        """Can a job of ``definition`` run with the platform's key here? Its provider must be
        configured, and have the platform key unless it needs none."""
        provider = self.provider_for(definition)
        if provider is None:
            return False
        return platform_key_configured or not getattr(provider, 'needs_api_key', False)

    def check_definitions(self, definitions):
        """Raise ConfigError at start-up for a definition this gateway cannot route: here, one
        that names a route (there are none without AIJOB_PROVIDERS); a missing provider fails
        its jobs with INTERNAL_PROVIDER_MISSING instead, as plugins may add it later."""
        for definition in definitions:
            if definition.route is not None:
                raise ConfigError(
                    'AIJOB_PROVIDERS is not set, but job type %s names its route %r'
                    % (definition.job_type, definition.route)
                )

    def cooldown_state(self):
        """{'provider/model': seconds of cooldown left}: none without routes."""
        return {}

    def next_entry(self, attempt, call, unavailable):
        """The ProviderCall that replaces ``call`` when its entry is unavailable (EntryUnavailable
        ``unavailable``), or None when the route has no other entry: here, never another."""
        return None

    def prepare_call(self, attempt, resolved, request):
        """The ProviderCall for the next call of a job: here, the provider and model RESOLVE
        routed it to."""
        return ProviderCall(
            job=attempt.job,
            definition=attempt.definition,
            request=request,
            provider=resolved.provider,
            model=resolved.model,
            call_no=request.attempt,
        )
