"""Many concurrent jobs in one worker (issue 9 item 4), small and untimed: a worker thread holds no
database connection while its provider call waits, so more jobs run at once than the pool has
connections; the batched heartbeat keeps every lock and keeps the fence per job.
(benchmarks/concurrency.py measures the 200-thread case against MariaDB + Redis.)"""

import contextlib
import time

import pytest

from engine.core.fences import Fence
from engine.core.models import AiJob
from engine.core.states import TERMINAL
from engine.dispatch.workers import Supervisor
from engine.execution.attempt import Attempt
from engine.execution.engine import ExecutionEngine
from tests.support.api import run_to_running
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

THREADS = 40
POOL = 8


@contextlib.contextmanager
def pool_capped(store, size):
    """Cap the MySQL pool at ``size`` for the test (stores on one URL share one pool, so an
    earlier test's runtime may have built it larger). SQLite has no pool: nothing to cap."""
    db = store.db
    if not hasattr(db, '_max_connections'):
        yield
        return
    before, db._max_connections = db._max_connections, size
    try:
        yield
    finally:
        db._max_connections = before


def most_at_once(rows):
    """The most jobs running at one instant, from their started_at/finished_at."""
    edges = sorted([(r.started_at, 1) for r in rows] + [(r.finished_at, -1) for r in rows])
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


@pytest.mark.slow
def test_more_jobs_run_at_once_than_the_pool_has_connections(make_runtime):
    settings = dict(
        FAST_SETTINGS,
        AIJOB_INTERACTIVE_CONCURRENCY=str(THREADS),
        AIJOB_DB_POOL_SIZE=str(POOL),
    )
    rt = make_runtime(registry=fast_registry(), **settings)
    with pool_capped(rt.store, POOL), rt.store.connection():
        rt.service.dispatch_now = None  # published by the dispatcher once the workers are up
        ids = [
            create_job(rt, user_id='u%d' % i, target_id=str(i), input={'sleepMs': 1000}).id
            for i in range(THREADS)
        ]
        rt.start_background()
        held = [0]

        def all_terminal():
            held[0] = max(held[0], len(rt.worker.engine.held_attempts()))
            finished = AiJob.select().where(
                AiJob.id.in_(ids) & AiJob.lifecycle_status.in_(list(TERMINAL))
            )
            return finished.count() == THREADS

        wait_until(all_terminal, timeout=90, interval=0.05)
        rows = list(AiJob.select().where(AiJob.id.in_(ids)))
    assert [r.lifecycle_status for r in rows] == ['succeeded'] * THREADS
    assert {r.attempt_no for r in rows} == {1}  # none taken over: every lock kept
    # With a connection held through each provider wait, at most POOL jobs could run at once.
    assert most_at_once(rows) > POOL
    assert held[0] > POOL


@pytest.mark.slow
def test_heartbeats_keep_every_lock_of_many_long_jobs(make_runtime):
    # lock TTL 1.5 s, heartbeat 0.3 s: a 2.5 s job needs several heartbeats to keep its lock.
    settings = dict(FAST_SETTINGS, AIJOB_INTERACTIVE_CONCURRENCY='20', AIJOB_DB_POOL_SIZE='4')
    rt = make_runtime(registry=fast_registry(), **settings)
    with pool_capped(rt.store, 4), rt.store.connection():
        rt.start_background()
        ids = [
            create_job(rt, user_id='u%d' % i, target_id=str(i), input={'sleepMs': 2500}).id
            for i in range(20)
        ]
        rows = [wait_terminal(rt, job_id, timeout=60) for job_id in ids]
    assert [r.lifecycle_status for r in rows] == ['succeeded'] * 20
    assert {r.attempt_no for r in rows} == {1}


def test_one_heartbeat_extends_every_held_lock_and_abandons_only_a_lost_one(engine_rt):
    """The batched heartbeat: one UPDATE for all held locks, one SELECT; a job taken over by
    another worker is abandoned alone; a cancel request reaches its job."""
    me = 'test-worker'
    engine = ExecutionEngine(engine_rt, me)
    supervisor = Supervisor(engine_rt, engine, me)
    definition = engine_rt.registry.get('synthetic')
    attempts = {}
    for name in ('kept', 'lost', 'cancelled'):
        job = create_job(engine_rt, user_id='u-' + name, input={'sleepMs': 5000})
        fence = run_to_running(engine_rt, job.id, me)
        attempt = Attempt(AiJob.get_by_id(job.id), definition, Fence(me, fence.attempt_no))
        engine.held[job.id] = attempts[name] = attempt
    lost = attempts['lost'].job.id
    AiJob.update(locked_by='worker-b', attempt_no=AiJob.attempt_no + 1).where(
        AiJob.id == lost
    ).execute()  # another worker took it over
    engine_rt.service.cancel_job(attempts['cancelled'].job.id)
    before = {name: AiJob.get_by_id(a.job.id).lock_until for name, a in attempts.items()}
    time.sleep(0.05)

    supervisor.beat()

    after = {name: AiJob.get_by_id(a.job.id) for name, a in attempts.items()}
    assert after['kept'].lock_until > before['kept']
    assert after['cancelled'].lock_until > before['cancelled']
    assert after['lost'].lock_until == before['lost']  # not ours: untouched
    assert after['lost'].locked_by == 'worker-b'
    assert attempts['lost'].abandoned and attempts['lost'].cancel_event.is_set()
    assert not attempts['kept'].abandoned and not attempts['kept'].cancel_event.is_set()
    assert not attempts['cancelled'].abandoned and attempts['cancelled'].cancel_event.is_set()


def test_a_finished_job_is_not_reported_lost(engine_rt):
    """An attempt that finished after the supervisor listed it is not abandoned."""
    me = 'test-worker'
    engine = ExecutionEngine(engine_rt, me)
    supervisor = Supervisor(engine_rt, engine, me)
    job = create_job(engine_rt, input={})
    fence = run_to_running(engine_rt, job.id, me)
    attempt = Attempt(AiJob.get_by_id(job.id), engine_rt.registry.get('synthetic'), fence)
    engine_rt.lifecycle.mark_succeeded(job.id, fence=fence)  # done, and no longer held
    supervisor.extend_locks([attempt])
    assert not attempt.abandoned


def test_the_fast_cancel_path_reads_the_flags_only_when_a_cancel_was_signalled(engine_rt):
    """check_cancel_signals: a signalled cancel reaches its running job (no heartbeat, no
    database read); a flag set without the signal's count moving is not looked at."""
    me = 'test-worker'
    engine = ExecutionEngine(engine_rt, me)
    supervisor = Supervisor(engine_rt, engine, me)
    definition = engine_rt.registry.get('synthetic')
    attempts = []
    for name in ('a', 'b'):
        job = create_job(engine_rt, user_id='u-' + name, input={'sleepMs': 5000})
        fence = run_to_running(engine_rt, job.id, me)
        attempt = Attempt(AiJob.get_by_id(job.id), definition, Fence(me, fence.attempt_no))
        engine.held[job.id] = attempt
        attempts.append(attempt)
    first, second = attempts
    supervisor.check_cancel_signals()  # the first look: nothing signalled
    assert not first.cancel_event.is_set() and not second.cancel_event.is_set()
    sent = engine_rt.queue.cancel_signals_sent()
    engine_rt.queue.signal_cancel(first.job.id)
    assert engine_rt.queue.cancel_signals_sent() != sent
    supervisor.check_cancel_signals()
    assert first.cancel_event.is_set() and not second.cancel_event.is_set()
    # The second's flag set, with the count as this supervisor last saw it: not read.
    engine_rt.queue.signal_cancel(second.job.id)
    supervisor._cancels_seen = engine_rt.queue.cancel_signals_sent()
    supervisor.check_cancel_signals()
    assert not second.cancel_event.is_set()
    engine_rt.queue.signal_cancel(second.job.id)  # the count moves: the flags are read
    supervisor.check_cancel_signals()
    assert second.cancel_event.is_set()
