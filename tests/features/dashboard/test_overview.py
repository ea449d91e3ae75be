"""The operators' overview reads (engine/features/dashboard/overview.py): jobs by state and
queue, the outbox's backlog, running jobs by worker, jobs finished per minute; and
Queue.consumers(), the workers alive by their heartbeats. Both backend pairs."""

import time

from engine.core.fences import Fence
from engine.features.dashboard.overview import Overview
from tests.support.api import run_to_failed, run_to_running
from tests.support.helpers import create_job


def succeed(rt, job_id, instance='worker-a'):
    fence = run_to_running(rt, job_id, instance)
    rt.lifecycle.mark_succeeded(job_id, fence=Fence(instance, fence.attempt_no))


def test_counts_by_state_and_queue(engine_rt):
    rt = engine_rt
    create_job(rt)
    create_job(rt, job_type='synthetic_bg')
    run_to_running(rt, create_job(rt).id)
    succeed(rt, create_job(rt).id)
    run_to_failed(rt, create_job(rt, job_type='synthetic_bg').id)
    counts = Overview(rt.store).state_counts(rt.store.clock())
    assert counts == {
        ('ai-interactive', 'queued'): 1,
        ('ai-interactive', 'running'): 1,
        ('ai-interactive', 'succeeded'): 1,
        ('ai-background', 'queued'): 1,
        ('ai-background', 'failed'): 1,
    }


def test_throughput_counts_each_finished_job_once_in_its_minute(engine_rt):
    rt = engine_rt
    for _ in range(2):
        succeed(rt, create_job(rt).id)
    run_to_failed(rt, create_job(rt).id)
    create_job(rt)  # still queued: not in the chart
    minutes = Overview(rt.store).throughput(rt.store.clock())
    assert len(minutes) == 60
    assert minutes == sorted(minutes, key=lambda m: m.start)
    assert sum(m.succeeded for m in minutes) == 2 and sum(m.failed for m in minutes) == 1
    last = [m for m in minutes if m.finished][-1]
    assert last.failure_rate == 1 / 3 or sum(m.finished for m in minutes[-2:]) == 3
    assert minutes[0].failure_rate is None


def test_running_jobs_by_worker_and_the_live_consumers(engine_rt):
    rt = engine_rt
    first, second = create_job(rt), create_job(rt)
    run_to_running(rt, first.id, 'worker-a')
    run_to_running(rt, second.id, 'worker-b')
    running = Overview(rt.store).running_by_worker()
    assert {w: [j.id for j in jobs] for w, jobs in running.items()} == {
        'worker-a': [first.id],
        'worker-b': [second.id],
    }
    rt.queue.heartbeat('worker-a', 30_000)
    rt.queue.heartbeat('worker-gone', 1)
    time.sleep(0.05)
    alive = rt.queue.consumers()
    assert 'worker-gone' not in alive
    if rt.config.uses_redis:
        # Redis knows a consumer once it has popped from a queue (it registers itself there).
        assert rt.queue.pop('ai-interactive', 'worker-a', 0.01) is not None
        alive = rt.queue.consumers()
    assert 0 < alive['worker-a'] <= 30_000


def test_outbox_counts(engine_rt):
    create_job(engine_rt)
    counts = Overview(engine_rt.store).outbox_counts()
    assert set(counts) == {'pending', 'processing', 'dead'}
    assert counts['pending'] + counts['processing'] == 1 and counts['dead'] == 0


def test_initdb_adds_the_finished_at_index_to_an_older_database(runtime):
    runtime.store.db.execute_sql(
        'DROP INDEX ai_job_finished_at' + (' ON ai_job' if runtime.store.dialect == 'mysql' else '')
    )
    assert 'ai_job_finished_at' not in {i.name for i in runtime.store.db.get_indexes('ai_job')}
    runtime.create_schema()
    assert 'ai_job_finished_at' in {i.name for i in runtime.store.db.get_indexes('ai_job')}
