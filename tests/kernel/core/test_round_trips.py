"""Statements that go out together (docs/architecture.md, decision 10): ``sql.send`` sends a
transaction's collected writes in one round trip on MariaDB/MySQL (one by one on SQLite), a
failure anywhere in them fails the transaction as it would have one statement at a time, and
a BEGIN waits for its transaction's first statement and goes with it."""

import threading

import peewee
import pytest

from engine.core.errors import JobLockConflictError
from engine.core.fences import Fence
from engine.core.history import NewEvent, insert_events
from engine.core.models import AiJob, AiJobEvent, OutboxEvent
from engine.core.sql import Statement, rows_together, send, write_row
from engine.execution.engine import ExecutionEngine
from tests.support.helpers import create_job

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects

INSERT_EVENT = Statement(
    'INSERT INTO ai_job_event (job_id, kind, attempt_no, detail, created_at) '
    "VALUES (%s, 'progress', 1, 'null', {now})"
)
INSERT_OUTBOX = Statement(
    'INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload, '
    "status, attempt_count, available_at, created_at, updated_at) VALUES ('t', 'AiJob', %s, %s, "
    "'null', 'published', 0, {now}, {now}, {now})"
)
COUNT_EVENTS = Statement('SELECT COUNT(*) FROM ai_job_event WHERE job_id = %s')


def counts(store):
    return store.statement_count(), store.round_trip_count()


def events_of(job_id):
    return AiJobEvent.select().where(AiJobEvent.job_id == job_id).count()


def test_a_transactions_writes_go_in_one_round_trip_and_each_gets_its_answer(runtime):
    store = runtime.store
    statements, round_trips = counts(store)
    with store.atomic():
        answers = send(
            [
                (INSERT_EVENT, ('rt-a',), lambda cursor: cursor.rowcount),
                (INSERT_EVENT, ('rt-b',), None),
                (COUNT_EVENTS, ('rt-a',), lambda cursor: cursor.fetchone()[0]),
            ]
        )
    sent = store.statement_count() - statements
    waited = store.round_trip_count() - round_trips
    assert answers == [1, None, 1]  # each answer its own statement's, in order
    assert events_of('rt-a') == events_of('rt-b') == 1
    assert sent == 5  # BEGIN, the three, COMMIT: every statement counts
    if store.dialect == 'mysql':
        assert waited == 2  # BEGIN with the three; COMMIT
    else:
        assert waited == sent  # SQLite is in the process: one at a time


def test_a_statement_that_fails_stops_the_rest_and_the_transaction_writes_nothing(runtime):
    store = runtime.store
    duplicate = ('rt-dup', 'rt-dedupe-key')
    with pytest.raises(peewee.IntegrityError):  # the driver's error, as peewee's, as always
        with store.atomic():
            send(
                [
                    (INSERT_EVENT, ('rt-before',), None),
                    (INSERT_OUTBOX, duplicate, None),
                    (INSERT_OUTBOX, duplicate, None),  # outbox_event.dedupe_key is UNIQUE
                    (INSERT_EVENT, ('rt-after',), None),
                ]
            )
    assert events_of('rt-before') == events_of('rt-after') == 0
    assert OutboxEvent.select().where(OutboxEvent.aggregate_id == 'rt-dup').count() == 0
    with store.atomic():  # the connection is in step: the next transaction works
        send([(INSERT_EVENT, ('rt-next',), None), (INSERT_EVENT, ('rt-next',), None)])
    assert events_of('rt-next') == 2


def test_an_answer_that_refuses_fails_the_transaction_once_every_result_is_read(runtime):
    store = runtime.store
    later = []

    def refuse(cursor):
        raise ValueError('refused by its answer')

    with pytest.raises(ValueError, match='refused by its answer'):
        with store.atomic():
            send(
                [
                    (INSERT_EVENT, ('rt-refused',), refuse),
                    (COUNT_EVENTS, ('rt-refused',), lambda cursor: later.append('read')),
                    (INSERT_EVENT, ('rt-refused',), None),
                ]
            )
    assert later == []  # after the first failure no answer is taken
    assert events_of('rt-refused') == 0  # rolled back, the statements after it too
    assert store.execute(COUNT_EVENTS, ('rt-refused',)).fetchone()[0] == 0  # in step


def test_rows_written_together_are_one_round_trip_whatever_their_tables(runtime):
    store = runtime.store
    statements, round_trips = counts(store)
    with store.atomic(), rows_together():
        insert_events(store, [NewEvent('rt-t%d' % i, 'progress', 1, {}) for i in range(3)])
        send([(INSERT_OUTBOX, ('rt-t', 'rt-t-key'), None)])  # now, not at the block's end
        insert_events(store, [NewEvent('rt-t9', 'progress', 1, {})])
    sent = store.statement_count() - statements
    waited = store.round_trip_count() - round_trips
    assert [events_of('rt-t%d' % i) for i in (0, 1, 2, 9)] == [1, 1, 1, 1]
    assert sent == 4  # BEGIN, the outbox row, the events' one INSERT, COMMIT
    assert waited == (3 if store.dialect == 'mysql' else 4)


def test_rows_written_last_go_out_after_the_others_each_in_the_order_they_came(runtime):
    """sql.write_row's ``last``: at the block's end those shapes follow every other, and each
    group of shapes keeps the order in which its shapes first came (a user's admission row,
    locked until the COMMIT, is then held only through the block's last statements)."""
    store, order = runtime.store, []

    def shaped(name):
        return lambda rows: [(Statement('SELECT 1'), (), lambda cursor: order.append(name))]

    with store.atomic(), rows_together():
        for name, last in (('a', True), ('b', False), ('c', True), ('b', False), ('d', False)):
            write_row(name, None, shaped(name), last=last)
        assert order == []  # nothing goes before the block's end
    assert order == ['b', 'd', 'a', 'c']


def test_a_transaction_that_sends_nothing_costs_no_round_trip_on_mysql(runtime):
    store = runtime.store
    before = counts(store)
    with store.atomic():
        pass
    statements, round_trips = counts(store)
    if store.dialect == 'mysql':
        assert (statements, round_trips) == before
    else:
        assert (statements - before[0], round_trips - before[1]) == (2, 2)  # BEGIN, COMMIT


@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_the_begin_sent_with_the_first_statement_holds_its_locks_until_commit(runtime, backend):
    """Were the first statement sent without its BEGIN (autocommit), its row lock would end
    with it: another connection's NOWAIT lock would succeed while the transaction is open."""
    store = runtime.store
    with store.atomic():
        insert_events(store, [NewEvent('rt-lock', 'progress', 1, {})])
    lock = 'SELECT id FROM ai_job_event WHERE job_id = %s FOR UPDATE'
    locked, release, outcome = threading.Event(), threading.Event(), []

    def holder():
        with store.connection(), store.atomic():
            store.db.execute_sql(lock, ('rt-lock',)).fetchall()
            locked.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        with store.connection():
            try:
                with store.atomic():
                    store.db.execute_sql(lock + ' NOWAIT', ('rt-lock',)).fetchall()
                outcome.append('took it')
            except peewee.OperationalError:
                outcome.append('held by the other')
    finally:
        release.set()
        thread.join(10)
    assert outcome == ['held by the other']


# ---------------------------------------------------------------- the COMMIT with the last writes
def test_a_block_that_ends_its_transaction_sends_the_commit_with_its_rows(runtime):
    store = runtime.store
    statements, round_trips = counts(store)
    commits = store.commit_count()
    with store.atomic(), rows_together(ends_transaction=True):
        insert_events(store, [NewEvent('rt-end%d' % i, 'progress', 1, {}) for i in range(2)])
        send([(INSERT_OUTBOX, ('rt-end', 'rt-end-key'), None)])
    sent = store.statement_count() - statements
    waited = store.round_trip_count() - round_trips
    assert store.commit_count() - commits == 1  # counted once, whichever way it went
    assert sent == 4  # BEGIN, the outbox row, the events' INSERT, COMMIT
    if store.dialect == 'mysql':
        assert waited == 2  # BEGIN with the outbox row; the events' INSERT with the COMMIT
    assert events_of('rt-end0') == events_of('rt-end1') == 1
    with store.atomic():  # the connection is in step and out of the transaction
        send([(INSERT_EVENT, ('rt-end-next',), None)])
    assert events_of('rt-end-next') == 1


def test_a_failure_in_the_rows_that_carry_the_commit_commits_nothing(runtime):
    store = runtime.store
    duplicate = ('rt-end-dup', 'rt-end-dedupe-key')
    with pytest.raises(peewee.IntegrityError):
        with store.atomic(), rows_together(ends_transaction=True):
            send([(INSERT_EVENT, ('rt-end-before',), None)])  # sent now, in the transaction
            insert_events(store, [NewEvent('rt-end-with', 'progress', 1, {})])
            write_row('dup-a', None, lambda rows: [(INSERT_OUTBOX, duplicate, None)])
            write_row('dup-b', None, lambda rows: [(INSERT_OUTBOX, duplicate, None)])
    assert events_of('rt-end-before') == events_of('rt-end-with') == 0
    with store.atomic():
        send([(INSERT_EVENT, ('rt-end-after',), None)])
    assert events_of('rt-end-after') == 1


@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_nothing_may_follow_the_rows_that_carried_the_commit(runtime, backend):
    """Autocommit would write a statement sent after the COMMIT on its own, outside the
    transaction it was written for: the store refuses it, and the transaction's own end then
    sends nothing (its rows are committed)."""
    store = runtime.store
    with pytest.raises(RuntimeError, match='nothing follows'):
        with store.atomic():
            with rows_together(ends_transaction=True):
                insert_events(store, [NewEvent('rt-end-then', 'progress', 1, {})])
            send([(INSERT_EVENT, ('rt-end-late',), None)])
    assert events_of('rt-end-then') == 1  # committed with the rows
    assert events_of('rt-end-late') == 0


@pytest.mark.parametrize('backend', ['mysql+redis', 'mysql-features+redis'], indirect=True)
def test_a_create_costs_one_round_trip_on_mariadb_two_on_mysql_and_a_lock_one(runtime, backend):
    """A create: BEGIN, the admission count, job, snapshot, outbox and history rows, COMMIT in
    one round trip (a refused count is the CHECK constraint's error, nothing read back). MySQL
    reads back its count and what RETURNING would have returned (the job's creation time, the
    event's id), in the writes' round trip, and sends its COMMIT after them (a count read back
    may refuse): 10 statements in 2 round trips. A batch's lock: BEGIN, the CAS UPDATE, its
    history rows, its read and COMMIT, one round trip on both."""
    store = runtime.store
    mariadb = backend.name == 'mysql+redis'
    assert store.insert_returns() == mariadb  # the URL's ?features=mysql: MySQL's branch
    assert store.enforces_check('ai_user_admission', 'admission_within_limits') == mariadb
    runtime.service.dispatch_now = None  # the push to Redis is no round trip to the database
    create_job(runtime, input={'warm': True})  # the first create reads what it then keeps
    jobs, costs = [], []
    for i in range(3):
        before = counts(store)
        jobs.append(create_job(runtime, input={'i': i}))
        costs.append(tuple(now - then for now, then in zip(counts(store), before, strict=True)))
    assert costs == [(7, 1) if mariadb else (10, 2)] * 3
    round_trips = store.round_trip_count()
    locked = runtime.lifecycle.lock_jobs([job.id for job in jobs], 'worker-rt')
    assert len(locked) == 3
    assert store.round_trip_count() - round_trips == 1
    assert AiJobEvent.select().where(AiJobEvent.kind == 'started').count() == 3


def lock_history(job_ids):
    """(job id, kind, attempt, worker) of the lock rows of ``job_ids``' histories, in order."""
    rows = (
        AiJobEvent.select()
        .where(AiJobEvent.job_id.in_(job_ids), AiJobEvent.kind.in_(['started', 'taken_over']))
        .order_by(AiJobEvent.id)
    )
    return [(e.job_id, e.kind, e.attempt_no, e.detail['worker']) for e in rows]


def test_a_batch_lock_writes_the_history_of_exactly_the_rows_it_took(runtime):
    """The lock's history rows are written by the database beside the UPDATE (MariaDB/MySQL):
    one per row this lock took, none for a row the same instance already held, none when it
    took nothing, and ``taken_over`` with the new holder for a lock taken from an expired one."""
    lifecycle = runtime.lifecycle
    a, b, c = (create_job(runtime, input={'n': n}).id for n in range(3))
    assert sorted(job.id for job, _ in lifecycle.lock_jobs([a, b], 'worker-x')) == sorted([a, b])
    # a and b are this instance's already: only c is taken, and only c gets a row
    assert [job.id for job, _ in lifecycle.lock_jobs([a, b, c], 'worker-x')] == [c]
    assert lifecycle.lock_jobs([a, c], 'worker-x') == []  # took nothing: wrote nothing
    history = lock_history([a, b, c])
    assert sorted(history[:2]) == sorted(
        [(a, 'started', 1, 'worker-x'), (b, 'started', 1, 'worker-x')]
    )
    assert history[2:] == [(c, 'started', 1, 'worker-x')]
    # a's holder stalls: its lock expires, and another worker takes the job over
    AiJob.update(lock_until=runtime.store.now_plus_ms(-1000)).where(AiJob.id == a).execute()
    taken = lifecycle.lock_jobs([a, b], 'worker-y')
    assert [(job.id, job.attempt_no) for job, _ in taken] == [(a, 2)]
    assert lock_history([a]) == [(a, 'started', 1, 'worker-x'), (a, 'taken_over', 2, 'worker-y')]


@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_an_answer_that_refuses_after_the_commit_ran_cannot_undo_it(runtime, backend, caplog):
    """Misuse (an answer that refuses in the rows that carry the COMMIT): the server has
    committed by then. The store knows it: the rollback that follows sends nothing and says so
    in the log, and the connection goes on in step."""

    def refuse(cursor):
        raise ValueError('refused too late')

    with pytest.raises(ValueError, match='refused too late'):
        with runtime.store.atomic():
            send([(INSERT_EVENT, ('rt-late',), refuse), (INSERT_EVENT, ('rt-late',), None)], True)
    assert events_of('rt-late') == 2
    assert 'transaction.rollback_after_commit' in caplog.text
    with runtime.store.atomic():
        send([(INSERT_EVENT, ('rt-late-next',), None)])
    assert events_of('rt-late-next') == 1


@pytest.mark.parametrize('backend', ['mysql+redis', 'mysql-features+redis'], indirect=True)
def test_a_finish_carries_its_commit_on_mariadb_and_a_refused_one_commits_nothing(runtime, backend):
    """A worker's group of finishes on MariaDB: BEGIN, the fenced UPDATE, its guard (a refusal
    is the server's error), the rows and the COMMIT in one round trip; on MySQL, which has no
    guard, the COMMIT goes once the UPDATE's row count is read (two). A refused finish commits
    nothing: none of its rows stay, and the group's other finish commits when the group runs
    again, each job on its own."""
    store, lifecycle = runtime.store, runtime.lifecycle
    mariadb = backend.name == 'mysql+redis'
    assert store.guards_row_counts() == mariadb
    a, b, c = (create_job(runtime, input={'n': n}).id for n in range(3))
    lifecycle.lock_jobs([a, b, c], 'worker-f')
    held, stranger = Fence('worker-f', 1), Fence('worker-stranger', 1)
    group = ExecutionEngine(runtime, 'worker-f').group_commit  # as the worker commits them

    def finish(job_id, fence):
        return lambda tx: lifecycle.mark_succeeded(job_id, fence=fence)

    round_trips = store.round_trip_count()
    assert group.run([finish(a, held)]) == [None]
    assert store.round_trip_count() - round_trips == (1 if mariadb else 2)
    outcomes = group.run([finish(b, stranger), finish(c, held)])
    assert isinstance(outcomes[0], JobLockConflictError) and outcomes[1] is None
    statuses = {job.id: job.lifecycle_status for job in AiJob.select()}
    assert (statuses[a], statuses[b], statuses[c]) == ('succeeded', 'running', 'succeeded')
    assert [e.kind for e in AiJobEvent.select().where(AiJobEvent.job_id == b)][-1] == 'started'
    assert (
        not OutboxEvent.select()
        .where(OutboxEvent.aggregate_id == b, OutboxEvent.event_type == 'ai.job.succeeded')
        .exists()
    )
