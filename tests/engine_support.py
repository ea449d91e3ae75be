"""Fixtures and helpers for tests that run jobs: fast intervals and fast synthetic variants."""

import pytest

from engine.core.lifecycle import TERMINAL
from engine.core.models import AiJob
from engine.core.registry import JobDefinitionRegistry
from engine.jobtypes.synthetic import synthetic_definition
from tests.helpers import create_job, wait_until

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
}


def fast_registry():
    registry = JobDefinitionRegistry()
    registry.register(synthetic_definition(backoff_ms=20))
    registry.register(
        synthetic_definition(
            job_type='synthetic_short', timeout_ms=1000, max_retries=1, backoff_ms=20
        )
    )
    registry.register(
        synthetic_definition(
            job_type='synthetic_short_retry',
            timeout_ms=1000,
            max_retries=1,
            backoff_ms=20,
            abort_strategy='retry',
        )
    )
    registry.register(
        synthetic_definition(job_type='synthetic_bg', queue_name='ai-background', backoff_ms=20)
    )
    return registry


@pytest.fixture
def engine_rt(make_runtime):
    """A runtime with fast settings and fast definitions; background loops not started."""
    rt = make_runtime(registry=fast_registry(), **FAST_SETTINGS)
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
