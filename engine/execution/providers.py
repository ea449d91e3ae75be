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
    JobCancelledError,
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


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


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


@dataclass
class ProviderResult:
    output: dict
    usage: Usage = field(default_factory=Usage)
    model: str = ''


class CallContext:
    """What a running attempt may ask of the engine: how long it has left, whether it was
    cancelled, progress reports, and a sleep that wakes up on cancellation or the deadline."""

    def __init__(self, deadline, cancel_event=None, on_progress=None, clock=time.monotonic):
        self.deadline = deadline  # a time.monotonic() value
        self.cancel_event = cancel_event or threading.Event()
        self._on_progress = on_progress
        self._clock = clock

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
