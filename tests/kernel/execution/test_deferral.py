"""Deferral (issue 21, docs/contracts.md §1.8): a job a guard tells to wait is handed back — still
``running``, with no holder and ``lock_until`` at its wake time — and woken by a durable wake-up;
it spends no retry and no attempt, is not locked before its time, survives its worker's restart,
ends ``cancelled`` at once when cancelled while waiting, and the reaper never counts it lost. On
both backend pairs."""

import threading
import time

import pytest

from engine.core.errors import IllegalTransitionError, JobDeferred, JobLockConflictError
from engine.core.models import AiJob, AiJobEvent, AiUsageLog, OutboxEvent
from engine.core.outbox import WAKE_EVENT
from engine.execution.engine import DEFERRED, ExecutionEngine
from engine.execution.providers import CallGuard
from engine.features.dashboard.pages import overview
from engine.features.metrics.scrape import StateCollector
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


class DeferTimes(CallGuard):
    """Says wait ``times`` times (``delay_s`` each), then lets every call through."""

    def __init__(self, times, delay_s):
        self.left = times
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def before(self, call):
        with self.lock:
            if self.left <= 0:
                return None
            self.left -= 1
        raise JobDeferred(self.delay_s, 'test_wait', {'left': self.left})


@pytest.fixture
def deferring_rt(make_runtime):
    """``deferring_rt(times, delay_s)``: a fast runtime whose guard defers each call that many
    times; background loops not started."""
    opened = []

    def make(times, delay_s, **settings):
        rt = make_runtime(registry=fast_registry(), **dict(FAST_SETTINGS, **settings))
        rt.ai.guards.append(DeferTimes(times, delay_s))
        opened.append(rt.store.connection())
        opened[-1].__enter__()
        return rt

    yield make
    for connection in reversed(opened):
        connection.__exit__(None, None, None)


def kinds(job_id):
    events = AiJobEvent.select().where(AiJobEvent.job_id == job_id).order_by(AiJobEvent.id)
    return [event.kind for event in events]


def pop_and_run(rt, engine, timeout_s=2.0):
    """Pop one message and run its job as a worker thread would; (delivery, status)."""
    delivery = rt.queue.pop('ai-interactive', engine.instance_id, timeout_s)
    assert delivery is not None
    return delivery, engine.execute(delivery.message.job_id)


def create_and_defer(rt, engine):
    """Create a job, push it and run it once, which its guard defers: (job, its delivery, not
    acked yet: some tests ack it late or never)."""
    job = create_job(rt)
    rt.dispatcher.cycle()
    delivery, status = pop_and_run(rt, engine)
    assert status == DEFERRED
    return job, delivery


def test_a_deferred_job_waits_without_a_holder_and_is_not_locked_before_its_time(deferring_rt):
    rt = deferring_rt(1, 1.5)
    engine = ExecutionEngine(rt, 'worker-a')  # no waker: the outbox carries the wake-up
    job, delivery = create_and_defer(rt, engine)
    rt.queue.ack(delivery)

    waiting = AiJob.get_by_id(job.id)
    assert (waiting.lifecycle_status, waiting.locked_by) == ('running', None)
    assert (waiting.attempt_no, waiting.defer_count, waiting.retry_count) == (1, 1, 0)
    ahead_s = (waiting.lock_until - waiting.updated_at).total_seconds()  # both at the deferral
    assert ahead_s == pytest.approx(1.5, abs=0.01)
    [deferred] = AiJobEvent.select().where(
        (AiJobEvent.job_id == job.id) & (AiJobEvent.kind == 'deferred')
    )
    assert deferred.detail['reason'] == 'test_wait' and deferred.detail['delayMs'] == 1500
    assert AiUsageLog.select().where(AiUsageLog.job_id == job.id).count() == 0  # no call made

    # Nobody takes it before its time: neither a lock nor an early message.
    with pytest.raises(JobLockConflictError):
        rt.lifecycle.lock_job(job.id, 'worker-b')
    assert engine.execute(job.id) is None
    assert rt.dispatcher.cycle() == 0  # its wake-up is not due yet
    [wake] = OutboxEvent.select().where(OutboxEvent.event_type == WAKE_EVENT)
    assert (wake.status, wake.aggregate_id) == ('pending', job.id)

    wait_until(lambda: rt.dispatcher.cycle() == 1, timeout=5)  # due: pushed
    delivery, status = pop_and_run(rt, engine)
    assert status == 'succeeded'
    done = AiJob.get_by_id(job.id)
    assert (done.attempt_no, done.defer_count, done.retry_count) == (2, 1, 0)
    assert kinds(job.id) == [
        'created',
        'dispatched',
        'started',
        'deferred',
        'taken_over',
        'succeeded',
    ]


def test_deferrals_spend_no_retry_and_no_attempt_of_the_queue(deferring_rt):
    # ai-interactive allows 2 locks; three deferrals make four, none of them an attempt.
    rt = deferring_rt(3, 0.2)
    rt.start_background()
    job = create_job(rt)
    done = wait_terminal(rt, job.id, timeout=20)
    assert done.lifecycle_status == 'succeeded'
    assert (done.attempt_no, done.defer_count, done.retry_count) == (4, 3, 0)
    assert kinds(job.id).count('deferred') == 3
    assert 'worker_lost' not in kinds(job.id) and 'retry_scheduled' not in kinds(job.id)
    # Each wake-up was pushed by the deferring process itself, at its time.
    wakes = list(OutboxEvent.select().where(OutboxEvent.event_type == WAKE_EVENT))
    assert len(wakes) == 3 and all(w.status in ('published', 'processing') for w in wakes)


def test_a_wake_up_is_not_swallowed_by_the_message_its_worker_has_not_acked_yet(deferring_rt):
    rt = deferring_rt(1, 0.05)
    engine = ExecutionEngine(rt, 'worker-a')
    job, first = create_and_defer(rt, engine)
    # The wake-up is pushed while the first message is still unacked (its marker still live).
    wait_until(lambda: rt.dispatcher.cycle() == 1, timeout=5)
    rt.queue.ack(first)
    _, status = pop_and_run(rt, engine)
    assert status == 'succeeded'
    assert AiJob.get_by_id(job.id).lifecycle_status == 'succeeded'


def test_cancel_while_deferred_ends_the_job_cancelled_at_once(deferring_rt):
    rt = deferring_rt(1, 30)
    engine = ExecutionEngine(rt, 'worker-a')
    job, delivery = create_and_defer(rt, engine)
    rt.queue.ack(delivery)

    cancelled = rt.service.cancel_job(job.id)
    assert cancelled.lifecycle_status == 'cancelled'
    row = AiJob.get_by_id(job.id)
    assert (row.error_code, row.lock_until) == ('CANCELLED', None) and row.finished_at
    assert kinds(job.id)[-2:] == ['deferred', 'cancelled']
    terminal = OutboxEvent.select().where(OutboxEvent.event_type == 'ai.job.cancelled')
    assert [e.aggregate_id for e in terminal] == [job.id]
    # Its wake-up, when it comes, finds nothing to run.
    with pytest.raises(IllegalTransitionError):
        rt.lifecycle.lock_job(job.id, 'worker-b')


def test_the_reaper_wakes_a_deferred_job_whose_wake_up_was_lost_and_never_counts_it_lost(
    deferring_rt,
):
    rt = deferring_rt(1, 0.1)
    engine = ExecutionEngine(rt, 'worker-a')
    job, delivery = create_and_defer(rt, engine)
    rt.queue.ack(delivery)
    # The wake-up event is lost (as with Redis's data): only the reaper is left.
    OutboxEvent.delete().where(OutboxEvent.event_type == WAKE_EVENT).execute()
    time.sleep(0.1 + int(FAST_SETTINGS['AIJOB_REAP_AFTER_MS']) / 1000.0 + 0.1)
    counts = rt.reaper.sweep()
    assert (counts['republished'], counts['failed']) == (1, 0)
    assert 'worker_lost' not in kinds(job.id)
    _, status = pop_and_run(rt, engine)
    assert status == 'succeeded'


def test_a_long_deferral_is_left_alone_by_the_reaper(deferring_rt):
    rt = deferring_rt(1, 30)
    engine = ExecutionEngine(rt, 'worker-a')
    job, _ = create_and_defer(rt, engine)
    time.sleep(int(FAST_SETTINGS['AIJOB_REAP_AFTER_MS']) / 1000.0 + 0.1)
    counts = rt.reaper.sweep()
    assert counts['republished'] == counts['failed'] == counts['skipped'] == 0
    row = AiJob.get_by_id(job.id)
    assert (row.lifecycle_status, row.locked_by, row.attempt_no) == ('running', None, 1)
    # The operators see it waiting, not lost, and its wake-up is not an outbox backlog.
    page = overview(rt)
    assert [j.id for j in page['deferred']] == [job.id] and page['lost'] == []
    rt.dispatcher.marks.flush()  # the create's own event, pushed at once, marked published
    [_, _, oldest] = StateCollector(rt.store, rt.queue)._outbox()
    assert oldest.samples[0].value == 0.0


@pytest.mark.slow
def test_a_deferred_job_survives_its_worker_stopping(deferring_rt, make_runtime, backend):
    rt = deferring_rt(1, 1.5)
    rt.start_background()
    job = create_job(rt)
    wait_until(lambda: 'deferred' in kinds(job.id), timeout=10)
    rt.stop_background(timeout_s=2)  # the wake-up it held goes back to the outbox
    [wake] = OutboxEvent.select().where(OutboxEvent.event_type == WAKE_EVENT)
    assert (wake.status, wake.locked_by) == ('pending', None)
    if backend.redis_url is None:
        # The in-memory queue lives in its process: the next process is this one again.
        rt.start_background()
    else:
        other = make_runtime(registry=fast_registry(), **FAST_SETTINGS)
        other.start_background()
    done = wait_terminal(rt, job.id, timeout=20)
    assert (done.lifecycle_status, done.defer_count, done.retry_count) == ('succeeded', 1, 0)


def test_a_wake_up_whose_process_died_before_pushing_it_is_pushed_by_the_dispatcher(
    deferring_rt,
):
    rt = deferring_rt(1, 0.05)

    class DeadWaker:  # the process died with its timer: it never pushes
        def schedule(self, event, delay_s):
            pass

    engine = ExecutionEngine(rt, 'worker-a', waker=DeadWaker())
    job, delivery = create_and_defer(rt, engine)
    rt.queue.ack(delivery)
    [wake] = OutboxEvent.select().where(OutboxEvent.event_type == WAKE_EVENT)
    assert (wake.status, wake.locked_by, wake.aggregate_id) == ('processing', 'worker-a', job.id)
    assert rt.dispatcher.cycle() == 0  # claimed by its (dead) process
    # The create's own event, pushed at once, is marked published by the dispatcher's mark
    # writer in its own time: only the wake-up may still be claimed when the claims expire
    # (on a loaded machine the mark once came after them, and two claims were released).
    claimed = OutboxEvent.status == 'processing'
    wait_until(lambda: OutboxEvent.select().where(claimed).count() == 1, timeout=10)
    time.sleep(int(FAST_SETTINGS['AIJOB_OUTBOX_LOCK_TTL_MS']) / 1000.0 + 0.1)
    assert rt.dispatcher.release_expired() == 1
    assert rt.dispatcher.cycle() == 1
    _, status = pop_and_run(rt, engine)
    assert status == 'succeeded'
