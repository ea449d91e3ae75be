"""One leader for the housekeeping (issue 13 item 3, architecture decision 12), in one process on
both backend pairs: the lease row's compare-and-set, the leadership that logs its changes, the
loops that run only on the leader, and the parts that must not wait on Redis (the lock extension,
the reaper's database decisions). Real worker processes:
tests/kernel/dispatch/test_leader_processes.py."""

import logging
import time

import pytest

from engine.core.errors import QueueUnavailableError
from engine.core.leases import Lease
from engine.core.models import AiJob, LeaderLease
from engine.core.store import db_now
from engine.dispatch.housekeeping import Reaper
from engine.dispatch.leader import Leadership
from engine.dispatch.redis_queue import RedisQueue
from engine.dispatch.workers import Supervisor
from engine.execution.attempt import Attempt
from engine.execution.engine import ExecutionEngine
from tests.features.metrics.test_metrics import scrape, value
from tests.support.api import run_to_running
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import FAST_SETTINGS
from tests.support.servers import free_port


def lease(rt, holder, ttl_ms=5000):
    return Lease(rt.store, 'test', holder, ttl_ms)


def expire_lease(name='test'):
    """Age the row past its expiry, as time would."""
    LeaderLease.update(expires_at=db_now(-10)).where(LeaderLease.name == name).execute()


def test_the_first_taker_holds_the_lease_and_others_learn_who_and_for_how_long(runtime):
    a, b = lease(runtime, 'a'), lease(runtime, 'b')
    assert a.take().held
    refused = b.take()
    assert (refused.held, refused.holder) == (False, 'a')
    assert 4000 < refused.remaining_ms <= 5000
    acquired_at = LeaderLease.get_by_id('test').acquired_at
    time.sleep(0.01)
    assert a.take().held  # a renewal keeps the time it was taken
    row = LeaderLease.get_by_id('test')
    assert row.acquired_at == acquired_at and row.holder == 'a'


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew(runtime):
    a, b = lease(runtime, 'a'), lease(runtime, 'b')
    assert a.take().held
    expire_lease()
    assert b.take().held
    refused = a.take()
    assert (refused.held, refused.holder) == (False, 'b')
    assert LeaderLease.select().count() == 1


def test_a_released_lease_is_free_at_once_and_only_its_holder_releases_it(runtime):
    a, b = lease(runtime, 'a'), lease(runtime, 'b')
    assert a.take().held
    assert not b.release()  # not b's to give
    assert not b.take().held
    assert a.release()
    assert b.take().held


def test_leadership_logs_its_changes_and_stops_leading_when_the_lease_is_taken(runtime, caplog):
    first = Leadership(runtime.store, 'worker-a', 1000, name='test')
    second = Leadership(runtime.store, 'worker-b', 1000, name='test')
    with caplog.at_level(logging.INFO, logger='aijob'):
        assert first.step() == pytest.approx(1 / 3)
        wait = second.step()
        assert first.held() and not second.held()
        assert 0.0 < wait <= 1 / 3  # retries by the time the lease it saw expires
        expire_lease()
        second.step()
        first.step()
    assert second.held() and not first.held()
    events = [
        (r.getMessage(), r.fields.get('reason'))
        for r in caplog.records
        if r.getMessage().startswith('leader.')
    ]
    assert events == [
        ('leader.acquired', None),
        ('leader.acquired', None),
        ('leader.lost', 'taken_over'),
    ]


def test_a_leader_that_cannot_reach_the_store_steps_down_when_its_lease_would_end(runtime, caplog):
    leadership = Leadership(runtime.store, 'worker-a', 300, name='test')
    leadership.step()
    assert leadership.held()
    leadership.lease.take = broken_take
    with caplog.at_level(logging.INFO, logger='aijob'):
        assert leadership.step() <= 0.3
        assert leadership.held()  # the lease it renewed has not run out yet
        time.sleep(0.31)
        leadership.step()
    assert not leadership.held()
    assert [r.getMessage() for r in caplog.records] == ['leader.renew_failed', 'leader.lost']


def broken_take():
    raise ConnectionError('store unreachable')


@pytest.mark.slow
def test_two_workers_on_one_database_have_one_leader_and_the_role_moves_on_a_clean_stop(
    make_runtime, backend
):
    if backend.redis_url is None:
        # Two processes' worth of workers need a queue they share; on the embedded pair one
        # process runs them, and holds the lease alone.
        rt = make_runtime(**FAST_SETTINGS)
        worker = rt.start_background()
        assert worker.leadership.held()
        return
    first = make_runtime(role='one', **FAST_SETTINGS)
    second = make_runtime(role='two', **FAST_SETTINGS)
    one, two = first.start_background(), second.start_background()
    assert one.leadership.held() and not two.leadership.held()
    first.stop_background(timeout_s=2)
    wait_until(two.leadership.held, timeout=1.0)  # released: at the next try, not the TTL


def dead_queue():
    """A real Redis client whose server is gone (nothing listens on the port)."""
    return RedisQueue('redis://127.0.0.1:%d/0' % free_port(), prefix='dead')


def expire_job_lock(job_id, ms=5000):
    AiJob.update(lock_until=db_now(-ms)).where(AiJob.id == job_id).execute()


def test_the_reaper_still_decides_from_the_database_while_the_queue_is_down(engine_rt):
    """Cancel and fail are written; a hand-over waits for the queue (no worker could pop it)."""
    cancelled = create_job(engine_rt, user_id='u1', input={'sleepMs': 5000})
    exhausted = create_job(engine_rt, user_id='u2', input={'sleepMs': 5000})
    handed_over = create_job(engine_rt, user_id='u3', input={'sleepMs': 5000})
    for job in (cancelled, exhausted, handed_over):
        run_to_running(engine_rt, job.id, 'dead-worker')
    engine_rt.service.cancel_signal = None
    engine_rt.service.cancel_job(cancelled.id)
    expire_job_lock(exhausted.id)
    run_to_running(engine_rt, exhausted.id, 'dead-worker-2')  # attempt 2 of 2
    for job in (cancelled, exhausted, handed_over):
        expire_job_lock(job.id)
    queue = dead_queue()
    with pytest.raises(QueueUnavailableError):
        queue.ping()

    counts = Reaper(engine_rt.lifecycle, queue, reap_after_ms=600).sweep()

    assert (counts['cancelled'], counts['failed'], counts['deferred']) == (1, 1, 1)
    status = {j.id: j.lifecycle_status for j in AiJob.select()}
    assert status[cancelled.id] == 'cancelled' and status[exhausted.id] == 'failed'
    assert status[handed_over.id] == 'running'
    # The queue is back: the deferred hand-over goes out at the next sweep.
    counts = engine_rt.reaper.sweep()
    assert counts['republished'] == 1


def test_the_lock_extension_does_not_wait_on_the_queue(engine_rt):
    me = 'test-worker'
    engine = ExecutionEngine(engine_rt, me)
    job = create_job(engine_rt, input={'sleepMs': 5000})
    fence = run_to_running(engine_rt, job.id, me)
    engine.held[job.id] = Attempt(
        AiJob.get_by_id(job.id), engine_rt.registry.get('synthetic'), fence
    )
    engine_rt.queue = dead_queue()
    supervisor = Supervisor(engine_rt, engine, me)
    before = AiJob.get_by_id(job.id).lock_until
    time.sleep(0.01)

    with pytest.raises(QueueUnavailableError):
        supervisor.beat()  # the consumer key fails …

    assert AiJob.get_by_id(job.id).lock_until > before  # … after the lock was extended


def test_a_hand_over_is_pushed_once_while_its_message_waits_for_a_worker(engine_rt):
    job = create_job(engine_rt, input={'sleepMs': 5000})
    run_to_running(engine_rt, job.id, 'dead-worker')
    expire_job_lock(job.id)
    reaper = Reaper(engine_rt.lifecycle, engine_rt.queue, reap_after_ms=600, repush_after_ms=300)
    before = engine_rt.queue.depth('ai-interactive')
    assert reaper.sweep()['republished'] == 1
    assert reaper.sweep()['waiting'] == 1  # its message waits: no second push
    time.sleep(0.35)
    assert reaper.sweep()['republished'] == 1  # not taken since: perhaps lost, push again
    assert engine_rt.queue.depth('ai-interactive') - before == 2


def test_the_scrape_shows_the_leader_and_the_time_left_on_its_lease(live_api):
    samples = scrape(live_api.admin)
    holder = live_api.runtime.instance_id
    left = value(samples, 'aijob_leader_lease_remaining_seconds', holder=holder)
    assert 0 < left <= 1.0  # FAST_SETTINGS: a 1 s lease, renewed every third of it


def test_a_released_leadership_takes_the_lease_no_more(runtime):
    first = Leadership(runtime.store, 'worker-a', 1000, name='test')
    second = Leadership(runtime.store, 'worker-b', 1000, name='test')
    first.step()
    first.release()
    first.step()  # a late turn of its thread
    assert not first.held()
    second.step()
    assert second.held()
