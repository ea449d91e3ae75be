"""Runtimes on the test backend: ``make_runtime`` builds any number; ``runtime`` is the default
one; ``engine_rt`` has fast intervals and fast synthetic definitions; ``provider_runtime`` and
``keyed_runtime`` have a (closed-port) platform provider, the latter with a credential master key.

A test that needs a variant job definition builds its runtime with a registry holding it
(``make_engine_rt(variant)`` or ``make_runtime(registry=fast_registry(variant))``): the registry
given to ``Runtime`` replaces the plugins' definitions. No test edits a registry after the fact.
"""

import base64
import contextlib

import pytest

from engine.core.models import AiJob
from engine.core.registry import JobDefinitionRegistry
from engine.core.states import TERMINAL
from engine.jobtypes.synthetic import synthetic_definition
from engine.runtime import Runtime
from tests.support.backends import reset_tables
from tests.support.helpers import create_job, wait_until

# Every interval shrunk to a few hundred milliseconds: recovery must still be correct, just faster.
FAST_SETTINGS = {
    'AIJOB_LOCK_TTL_MS': '1500',
    'AIJOB_HEARTBEAT_MS': '300',
    'AIJOB_REAP_AFTER_MS': '600',
    'AIJOB_REAPER_INTERVAL_MS': '200',
    'AIJOB_OUTBOX_POLL_MS': '100',
    'AIJOB_OUTBOX_LOCK_TTL_MS': '1000',
    'AIJOB_OUTBOX_RELEASE_MS': '300',
    'AIJOB_RECONCILE_AFTER_MS': '500',
    'AIJOB_SHUTDOWN_GRACE_MS': '3000',
    'AIJOB_LEADER_LEASE_MS': '1000',
    # The specification's concurrency (auto is 16 in process, 1 000 with Redis): tests that
    # need a job waiting behind a busy pool count on it.
    'AIJOB_INTERACTIVE_CONCURRENCY': '2',
    'AIJOB_BACKGROUND_CONCURRENCY': '1',
}

# A platform provider that is configured (so AI job types are available) but never answers.
PROVIDER_SETTINGS = {
    'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:9/v1',
    'AIJOB_PLATFORM_API_KEY': 'sk-platform-0000000000',
}
MASTER_KEY = base64.b64encode(b'k' * 32).decode('ascii')  # AIJOB_CREDENTIAL_MASTER_KEY


def fast_registry(*variants):
    """The fast synthetic definitions; each of ``variants`` replaces the one of its job type (or
    is added if no fast definition has that type)."""
    definitions = {
        d.job_type: d
        for d in (
            synthetic_definition(backoff_ms=20),
            synthetic_definition(
                job_type='synthetic_short', timeout_ms=1000, max_retries=1, backoff_ms=20
            ),
            synthetic_definition(
                job_type='synthetic_short_retry',
                timeout_ms=1000,
                max_retries=1,
                backoff_ms=20,
                abort_strategy='retry',
            ),
            synthetic_definition(
                job_type='synthetic_bg', queue_name='ai-background', backoff_ms=20
            ),
        )
    }
    definitions.update((d.job_type, d) for d in variants)
    registry = JobDefinitionRegistry()
    for definition in definitions.values():
        registry.register(definition)
    return registry


@pytest.fixture
def make_runtime(backend):
    """Build runtimes on the backend (a test may want several: two dispatchers, say).
    ``registry``, when given, replaces the plugins' job definitions."""
    made = []

    def make(registry=None, role='test', **settings):
        runtime = Runtime(backend.config(**settings), role=role, registry=registry)
        if not made:
            runtime.create_schema()
            reset_tables(runtime)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.close()


@pytest.fixture
def runtime(make_runtime):
    """The default runtime (built-in job types, no provider), with a connection open."""
    rt = make_runtime()
    with rt.store.connection():
        yield rt


@pytest.fixture
def make_engine_rt(make_runtime):
    """``make_engine_rt(*variants)``: a fast runtime (FAST_SETTINGS, ``fast_registry(*variants)``)
    with a connection open until the test ends; background loops not started."""
    with contextlib.ExitStack() as stack:

        def make(*variants):
            rt = make_runtime(registry=fast_registry(*variants), **FAST_SETTINGS)
            stack.enter_context(rt.store.connection())
            return rt

        yield make


@pytest.fixture
def engine_rt(make_engine_rt):
    """A runtime with fast settings and fast definitions; background loops not started."""
    return make_engine_rt()


@pytest.fixture
def provider_runtime(make_runtime):
    """Built-in job types with a platform provider configured (PROVIDER_SETTINGS, never answers)."""
    rt = make_runtime(**PROVIDER_SETTINGS)
    with rt.store.connection():
        yield rt


@pytest.fixture
def keyed_runtime(make_runtime):
    """``provider_runtime`` plus a credential master key (MASTER_KEY): users' keys can be stored."""
    rt = make_runtime(AIJOB_CREDENTIAL_MASTER_KEY=MASTER_KEY, **PROVIDER_SETTINGS)
    with rt.store.connection():
        yield rt


def wait_terminal(rt, job_id, timeout=20.0):
    def terminal():
        job = AiJob.get_by_id(job_id)
        return job if job.lifecycle_status in TERMINAL else None

    return wait_until(terminal, timeout=timeout)


def run_job(rt, job_type='synthetic', **input):
    """Create a job and wait for it to finish (the background must be running)."""
    job = create_job(rt, job_type=job_type, input=input)
    return wait_terminal(rt, job.id)
