"""The purger: expired snapshots of finished jobs and old published or dead outbox events go;
everything a live job or a pending event still needs stays."""

import pytest

from engine.core.errors import JobNotRetryableError, ProviderError
from engine.core.lifecycle import Fence
from engine.core.models import AiJobSnapshot, OutboxEvent
from engine.core.outbox import DEAD, PENDING, PUBLISHED
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

DAY_MS = 24 * 3600 * 1000


def failed_job(runtime, target_id):
    job = create_job(runtime, target_id=target_id)
    locked = runtime.lifecycle.lock_job(job.id, 'w1')
    runtime.lifecycle.mark_failed(
        job.id, ProviderError('boom'), fence=Fence('w1', locked.attempt_no)
    )
    return runtime.lifecycle.get(job.id)


def expire_snapshot(runtime, job_id):
    AiJobSnapshot.update(expires_at=runtime.store.now_plus_ms(-1000)).where(
        AiJobSnapshot.job_id == job_id
    ).execute()


def has_snapshot(job_id):
    return AiJobSnapshot.select().where(AiJobSnapshot.job_id == job_id).exists()


def test_expired_snapshots_of_finished_jobs_go_and_the_rest_stay(runtime):
    expired_done = failed_job(runtime, 'expired-done')
    fresh_done = failed_job(runtime, 'fresh-done')
    expired_queued = create_job(runtime, target_id='expired-queued')
    expire_snapshot(runtime, expired_done.id)
    expire_snapshot(runtime, expired_queued.id)

    counts = runtime.purger.sweep()

    assert counts['snapshots'] == 1 and not has_snapshot(expired_done.id)
    assert has_snapshot(fresh_done.id) and has_snapshot(expired_queued.id)
    with pytest.raises(JobNotRetryableError):
        runtime.service.retry_job(expired_done.id)
    assert runtime.service.retry_job(fresh_done.id).retry_of_job_id == fresh_done.id


def test_old_published_and_dead_events_go_pending_and_recent_ones_stay(runtime):
    runtime.service.dispatch_now = None
    ids = {}
    for name, status, age_ms in (
        ('old-published', PUBLISHED, 8 * DAY_MS),
        ('old-dead', DEAD, 8 * DAY_MS),
        ('old-pending', PENDING, 8 * DAY_MS),
        ('new-published', PUBLISHED, 1000),
    ):
        job = create_job(runtime, target_id=name)
        then = runtime.store.now_plus_ms(-age_ms)
        OutboxEvent.update(status=status, available_at=then, updated_at=then).where(
            OutboxEvent.aggregate_id == job.id
        ).execute()
        ids[name] = job.id

    assert runtime.purger.sweep()['outbox'] == 2

    left = {e.aggregate_id for e in OutboxEvent.select(OutboxEvent.aggregate_id)}
    assert left == {ids['old-pending'], ids['new-published']}


def test_batches_repeat_until_the_table_is_clean(runtime):
    runtime.purger.batch_size = 2
    jobs = [failed_job(runtime, 'batch-%d' % i) for i in range(5)]
    for job in jobs:
        expire_snapshot(runtime, job.id)
    assert runtime.purger.sweep()['snapshots'] == 5
    assert not any(has_snapshot(job.id) for job in jobs)


def test_the_worker_runs_the_purger_on_its_interval(make_runtime):
    settings = dict(FAST_SETTINGS, AIJOB_SNAPSHOT_TTL_MS='1', AIJOB_PURGE_INTERVAL_MS='100')
    rt = make_runtime(registry=fast_registry(), **settings)
    with rt.store.connection():
        rt.start_background()
        job = create_job(rt, input={'output': {'ok': True}})
        assert wait_terminal(rt, job.id).lifecycle_status == 'succeeded'
        wait_until(lambda: not has_snapshot(job.id), timeout=10)
