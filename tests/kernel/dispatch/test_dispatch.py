"""OutboxDispatcher (contracts §4.3–4.5): claim before push, each event pushed once, outages back
off."""

import threading

import pymysql
import pytest

from engine.core.errors import QueueUnavailableError
from engine.core.models import AiJob, AiUsageLog, OutboxEvent
from engine.core.outbox import PENDING, PUBLISHED
from engine.core.sql import Statement
from engine.dispatch.dispatcher import OutboxDispatcher, PublishMarks
from engine.dispatch.redis_queue import RedisQueue
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import wait_terminal


def pending_jobs(rt, count):
    rt.service.dispatch_now = None  # leave every event to the dispatchers
    with rt.store.atomic():
        return [create_job(rt, user_id='user-%d' % i, target_id=str(i)) for i in range(count)]


@pytest.mark.slow
def test_two_dispatchers_over_a_thousand_events_push_each_once(engine_rt):
    jobs = pending_jobs(engine_rt, 1000)
    dispatchers = [
        OutboxDispatcher(engine_rt.outbox, engine_rt.queue, 'dispatcher-%d' % i, batch_size=50)
        for i in range(2)
    ]
    published = [0, 0]
    # Each dispatcher's first claim comes before either's second. Without this, one could be
    # left out: on SQLite a writer waiting for the write lock retries at growing intervals (up
    # to 100 ms), and the other dispatcher's whole run takes about that long.
    first_claims = threading.Barrier(2)

    def drive(i):
        with engine_rt.store.connection():
            try:
                published[i] += dispatchers[i].cycle()
            finally:
                first_claims.wait()
            while OutboxEvent.select().where(OutboxEvent.status == PENDING).exists():
                published[i] += dispatchers[i].cycle()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sum(published) == 1000 and all(published)  # both took part, none twice
    assert OutboxEvent.select().where(OutboxEvent.status == PUBLISHED).count() == 1000
    assert engine_rt.queue.depth('ai-interactive') == 1000  # exactly one message per event
    engine_rt.start_background()
    for job in jobs:
        wait_terminal(engine_rt, job.id, timeout=120)
    assert AiJob.select().where(AiJob.lifecycle_status == 'succeeded').count() == 1000
    assert AiJob.select().where(AiJob.attempt_no != 1).count() == 0  # executed once each
    assert AiUsageLog.select().count() == 1000


@pytest.mark.slow
@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_a_published_mark_that_loses_a_lock_wait_is_tried_again(engine_rt, backend):
    """A batch mark written alone (no transaction around it) that loses to another
    connection's lock (here a lock wait timeout; a deadlock is handled alike) is tried again,
    not failed: the dispatcher's cycle would fail and its events be pushed a second time."""
    [job] = pending_jobs(engine_rt, 1)
    outbox, store = engine_rt.outbox, engine_rt.store
    [event] = outbox.claim_batch('dispatcher-x')
    params = store.db.connect_params
    blocker = pymysql.connect(
        host=params['host'],
        port=params['port'],
        user=params['user'],
        password=params['password'],
        database=store.db.database,
    )
    store.execute(Statement('SET SESSION innodb_lock_wait_timeout = 1'))
    try:
        with blocker.cursor() as cursor:
            cursor.execute('SELECT id FROM outbox_event WHERE id = %s FOR UPDATE', (event.id,))
        release = threading.Timer(1.5, blocker.commit)  # after the first try timed out
        release.start()
        statements = store.statement_count()
        assert outbox.mark_published_batch([event.id], 'dispatcher-x') == 1
        assert store.statement_count() - statements >= 2  # a timed-out try, then the write
        release.join()
    finally:
        store.execute(Statement('SET SESSION innodb_lock_wait_timeout = DEFAULT'))
        blocker.close()
    assert OutboxEvent.get_by_id(event.id).status == PUBLISHED


def test_a_lost_claim_is_skipped(engine_rt):
    [job] = pending_jobs(engine_rt, 1)
    event = OutboxEvent.get(OutboxEvent.aggregate_id == job.id)
    assert [e.id for e in engine_rt.outbox.claim_batch('someone-else')] == [event.id]
    assert engine_rt.dispatcher.cycle() == 0
    assert engine_rt.queue.depth('ai-interactive') == 0


def test_unknown_event_types_are_marked_published_without_dispatch(engine_rt):
    with engine_rt.store.atomic() as tx:
        engine_rt.outbox.create_in_transaction(
            tx,
            event_type='ai.job.mystery',
            aggregate_type='AiJob',
            aggregate_id='x',
            dedupe_key='mystery:1',
            payload={},
        )
    assert engine_rt.dispatcher.cycle() == 1
    assert OutboxEvent.get(OutboxEvent.dedupe_key == 'mystery:1').status == PUBLISHED
    assert engine_rt.queue.depth('ai-interactive') == 0


def test_a_bad_payload_is_a_real_rejection_and_dies_after_three(engine_rt):
    with engine_rt.store.atomic() as tx:
        event = engine_rt.outbox.create_in_transaction(
            tx,
            event_type='ai.job.enqueue',
            aggregate_type='AiJob',
            aggregate_id='x',
            dedupe_key='bad:1',
            payload={'jobId': 'x'},
        )
    engine_rt.dispatcher.retry_delay_ms = 0
    for _ in range(3):
        engine_rt.dispatcher.cycle()
    assert (
        OutboxEvent.get_by_id(event.id).status,
        OutboxEvent.get_by_id(event.id).attempt_count,
    ) == ('dead', 3)


@pytest.mark.slow
def test_a_queue_outage_hands_events_back_without_burning_attempts(engine_rt):
    [job] = pending_jobs(engine_rt, 1)
    down = RedisQueue('redis://127.0.0.1:1/0', prefix='down')
    dispatcher = OutboxDispatcher(engine_rt.outbox, down, 'dispatcher-down')
    for _ in range(5):
        OutboxEvent.update(available_at=OutboxEvent.created_at).execute()  # due again at once
        assert dispatcher.cycle() == 0
    event = OutboxEvent.get(OutboxEvent.aggregate_id == job.id)
    assert (event.status, event.attempt_count) == (PENDING, 0)
    assert dispatcher._outage_backoff_s > 0
    OutboxEvent.update(available_at=OutboxEvent.created_at).execute()
    assert engine_rt.dispatcher.cycle() == 1  # the queue is back


def test_a_dispatcher_that_died_after_its_claim_is_covered(engine_rt):
    [job] = pending_jobs(engine_rt, 1)
    event = OutboxEvent.get(OutboxEvent.aggregate_id == job.id)
    assert [e.id for e in engine_rt.outbox.claim_batch('crashed')] == [event.id]  # never pushed
    engine_rt.start_background()  # releases after the TTL
    assert wait_terminal(engine_rt, job.id).lifecycle_status == 'succeeded'


@pytest.mark.slow
def test_immediate_dispatch_starts_a_job_without_waiting_for_a_poll(engine_rt):
    engine_rt.dispatcher.poll_ms = 60_000
    engine_rt.start_background()
    job = create_job(engine_rt)
    wait_until(lambda: AiJob.get_by_id(job.id).lifecycle_status == 'succeeded', timeout=5)
    # The event was pushed at once; its mark as published follows in the next batch of marks.
    wait_until(lambda: OutboxEvent.get(OutboxEvent.aggregate_id == job.id).status == PUBLISHED)


class HalfwayOutage:
    """A real queue that goes down half-way through a batch: the first half of the messages
    reach it, then the push fails as a dropped Redis connection would."""

    def __init__(self, queue):
        self.queue = queue

    def push_many(self, messages):
        for message in messages[: len(messages) // 2]:
            self.queue.push(message)
        raise QueueUnavailableError('connection lost mid-batch')


def test_a_batch_whose_push_fails_half_way_loses_no_event_and_runs_each_job_once(engine_rt):
    jobs = pending_jobs(engine_rt, 20)
    broken = OutboxDispatcher(engine_rt.outbox, HalfwayOutage(engine_rt.queue), 'dispatcher-x')
    assert broken.cycle() == 0
    statuses = {e.status for e in OutboxEvent.select(OutboxEvent.status)}
    assert statuses == {PENDING}  # all handed back, none counted as an attempt
    assert engine_rt.queue.depth('ai-interactive') == 10  # the half that got through
    OutboxEvent.update(available_at=OutboxEvent.created_at).execute()
    assert engine_rt.dispatcher.cycle() == 20  # the rest, and the first half again: harmless
    assert engine_rt.queue.depth('ai-interactive') == 20  # the push is idempotent per job
    engine_rt.start_background()
    for job in jobs:
        wait_terminal(engine_rt, job.id)
    assert AiJob.select().where(AiJob.attempt_no != 1).count() == 0  # each ran once


def test_the_published_marks_of_eager_pushes_are_written_in_one_statement(engine_rt):
    marks = PublishMarks(engine_rt.outbox, 'claimer-1', engine_rt.store.connection, interval_s=60)
    ids = []
    with engine_rt.store.atomic() as tx:
        for i in range(30):
            event = engine_rt.outbox.create_in_transaction(
                tx,
                event_type='ai.job.enqueue',
                aggregate_type='AiJob',
                aggregate_id='job-%d' % i,
                dedupe_key='marks:%d' % i,
                payload={},
                claimed_by='claimer-1',
            )
            ids.append(event.id)
    marks.add(ids)  # as each eager push succeeds
    assert OutboxEvent.select().where(OutboxEvent.status == PUBLISHED).count() == 0
    before = engine_rt.store.statement_count()
    assert marks.flush() == 30
    assert engine_rt.store.statement_count() - before == 1  # one UPDATE for the 30
    assert OutboxEvent.select().where(OutboxEvent.status == PUBLISHED).count() == 30
    marks.close()
