"""The purger: expired snapshots of finished jobs, old published or dead outbox events, the
history of jobs finished long ago and old delivered or dead webhook deliveries go; everything a
live job, a pending event or a delivery still being sent needs stays."""

import itertools

import pytest

from engine.core.errors import JobNotRetryableError, ProviderError
from engine.core.fences import Fence
from engine.core.history import JobHistory
from engine.core.models import (
    AiJob,
    AiJobEvent,
    AiJobSnapshot,
    OutboxEvent,
    new_id,
)
from engine.core.outbox import DEAD, PENDING, PUBLISHED
from engine.features.webhooks.models import WebhookDelivery
from engine.features.webhooks.repository import DEAD as WEBHOOK_DEAD
from engine.features.webhooks.repository import DELIVERED, SENDING
from engine.features.webhooks.repository import PENDING as WEBHOOK_PENDING
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


def age_history(runtime, job_id, age_ms, finished=True):
    then = runtime.store.now_plus_ms(-age_ms)
    AiJobEvent.update(created_at=then).where(AiJobEvent.job_id == job_id).execute()
    if finished:
        AiJob.update(finished_at=then).where(AiJob.id == job_id).execute()


def history_kinds(runtime, job_id):
    return [event.kind for event in JobHistory(runtime.store).list(job_id)]


def test_the_history_of_jobs_finished_long_ago_goes_and_the_rest_stays(runtime):
    old_done = failed_job(runtime, 'old-done')
    recent_done = failed_job(runtime, 'recent-done')
    old_queued = create_job(runtime, target_id='old-queued')  # old rows, job not finished
    age_history(runtime, old_done.id, 31 * DAY_MS)
    age_history(runtime, recent_done.id, 1000)
    age_history(runtime, old_queued.id, 31 * DAY_MS, finished=False)
    kept = {job.id: history_kinds(runtime, job.id) for job in (recent_done, old_queued)}
    old_rows = len(history_kinds(runtime, old_done.id))
    assert old_rows >= 2 and all(kept.values())

    assert runtime.purger.sweep()['history'] == old_rows
    assert history_kinds(runtime, old_done.id) == []
    assert {job_id: history_kinds(runtime, job_id) for job_id in kept} == kept
    assert runtime.lifecycle.get(old_done.id).lifecycle_status == 'failed'  # the job stays


def test_history_retention_is_a_setting(make_runtime):
    rt = make_runtime(AIJOB_HISTORY_RETENTION_MS='60000')
    with rt.store.connection():
        done = failed_job(rt, 'one-minute')
        age_history(rt, done.id, 61_000)
        rows = len(history_kinds(rt, done.id))
        assert rows >= 2  # created, started, failed at least
        assert rt.purger.sweep()['history'] == rows
        assert history_kinds(rt, done.id) == []


def delivery(runtime, status, age_ms):
    then = runtime.store.now_plus_ms(-age_ms)
    row = {
        'id': new_id(),
        'endpoint_id': new_id(),
        'event_id': next(EVENT_IDS),
        'event_type': 'job.succeeded',
        'job_id': new_id(),
        'status': status,
        'attempt_count': 1,
        'next_attempt_at': then,
        'created_at': then,
        'updated_at': then,
    }
    WebhookDelivery.insert(row).execute()
    return row['id']


EVENT_IDS = itertools.count(1)


def test_old_delivered_and_dead_deliveries_go_pending_sending_and_recent_ones_stay(runtime):
    ids = {
        (status, age): delivery(runtime, status, age)
        for status in (DELIVERED, WEBHOOK_DEAD, WEBHOOK_PENDING, SENDING)
        for age in (8 * DAY_MS, 1000)
    }

    assert runtime.purger.sweep()['webhook_deliveries'] == 2

    left = {row.id for row in WebhookDelivery.select(WebhookDelivery.id)}
    gone = {ids[(DELIVERED, 8 * DAY_MS)], ids[(WEBHOOK_DEAD, 8 * DAY_MS)]}
    assert left == set(ids.values()) - gone
    assert runtime.purger.sweep()['webhook_deliveries'] == 0  # nothing left to do
