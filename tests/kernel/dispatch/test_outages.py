"""The store taken away under a running job, on a MariaDB of the test's own: the worker keeps the
job through the outage and finishes it when the store returns; nothing runs twice."""

import time

import pytest

from engine.core.models import AiJob, AiJobArtifact
from engine.extensions import load_config
from engine.runtime import Runtime
from tests.support.helpers import create_job
from tests.support.servers import private_mariadb  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


def read_job(runtime, job_id):
    """The job's row, or None while the store does not answer."""
    try:
        with runtime.store.connection():
            return AiJob.get_by_id(job_id)
    except Exception as exc:
        if runtime.store.is_unreachable(exc):
            return None
        raise


def wait_for(runtime, job_id, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = read_job(runtime, job_id)
        if job is not None and predicate(job):
            return job
        time.sleep(0.1)
    raise AssertionError('job %s: condition not reached within %.0fs' % (job_id, timeout_s))


def test_a_worker_keeps_its_job_through_a_store_outage_and_finishes_it_after(private_mariadb):  # noqa: F811
    settings = {
        'AIJOB_DATABASE_URL': private_mariadb.url,
        'AIJOB_LOCK_TTL_MS': '30000',  # longer than the outage: nobody may take the job over
        'AIJOB_HEARTBEAT_MS': '500',
        'AIJOB_OUTBOX_POLL_MS': '200',
    }
    runtime = Runtime(load_config(environ=settings), role='outage')
    try:
        runtime.create_schema()
        runtime.start_background()
        with runtime.store.connection():
            job = create_job(runtime, input={'sleepMs': 1500, 'output': {'ok': True}})
        wait_for(runtime, job.id, lambda j: j.lifecycle_status == 'running', timeout_s=10)

        private_mariadb.stop()  # the call finishes while the store is away
        time.sleep(3)
        private_mariadb.start()

        done = wait_for(runtime, job.id, lambda j: j.lifecycle_status != 'running', timeout_s=10)
        assert (done.lifecycle_status, done.attempt_no) == ('succeeded', 1)
        with runtime.store.connection():
            links = AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count()
        assert links == 1
    finally:
        runtime.close()
