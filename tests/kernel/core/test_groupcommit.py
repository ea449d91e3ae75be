"""Group commit (engine/core/groupcommit.py): works of several threads in one transaction, a
failing work taken out alone, and the worker's batches built on it."""

import dataclasses
import threading
import time

import pytest
from peewee import fn

from engine.core.groupcommit import GroupCommit
from engine.core.history import NewEvent, insert_events
from engine.core.models import (
    AiArtifact,
    AiJob,
    AiJobArtifact,
    AiJobEvent,
    AiUserAdmission,
    OutboxEvent,
)
from engine.core.service import PushNow
from engine.execution.engine import ExecutionEngine
from tests.kernel.execution.test_execution import FlakyProjector, usage_rows
from tests.support.helpers import create_job, record_sent_statements
from tests.support.runtimes import fast_registry

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def event_work(store, job_id, fail=False):
    def work(tx):
        insert_events(store, [NewEvent(job_id, 'progress', 1, {})])
        if fail:
            raise ValueError('this work fails after its write')

    return work


def events(job_id):
    return AiJobEvent.select().where(AiJobEvent.job_id == job_id).count()


def test_works_of_many_threads_commit_together_and_are_visible_on_return(runtime):
    store, group = runtime.store, GroupCommit(runtime.store)
    seen, errors = [], []

    def thread(n):
        try:
            with store.connection():
                works = [event_work(store, 'gc-%d-%d' % (n, i)) for i in range(5)]
                assert group.run(works) == [None] * 5
                # committed before run returns: another connection sees every row
                seen.append(all(events('gc-%d-%d' % (n, i)) == 1 for i in range(5)))
        except Exception as exc:  # collected for the assertion below
            errors.append(exc)

    commits_before = store.commit_count()
    threads = [threading.Thread(target=thread, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and seen == [True] * 8
    assert group.works == 40 and group.groups == store.commit_count() - commits_before
    assert group.groups <= 8


def test_a_failing_work_is_rolled_back_alone_and_gets_its_error(runtime):
    store, group = runtime.store, GroupCommit(runtime.store)
    works = [
        event_work(store, 'ok-1'),
        event_work(store, 'bad', fail=True),
        event_work(store, 'ok-2'),
    ]
    with store.connection():
        outcomes = group.run(works)
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], ValueError)
        assert (events('ok-1'), events('bad'), events('ok-2')) == (1, 0, 1)


def test_a_batch_locks_in_one_statement_and_commits_its_results_together(engine_rt):
    ids = [create_job(engine_rt, input={'output': {'n': i}}).id for i in range(6)]
    engine = ExecutionEngine(engine_rt, 'worker-batch')
    commits = engine_rt.store.commit_count()
    statuses = engine.execute_batch(ids)
    assert statuses == {job_id: 'succeeded' for job_id in ids}
    assert engine_rt.store.commit_count() - commits == 2  # the lock, then one group commit
    for i, job_id in enumerate(ids):
        job = AiJob.get_by_id(job_id)
        assert (job.lifecycle_status, job.attempt_no, job.retry_count) == ('succeeded', 1, 0)
        [link] = AiJobArtifact.select().where(AiJobArtifact.job_id == job_id)
        assert AiArtifact.get_by_id(link.artifact_id).content == {'n': i}
    assert engine.held_attempts() == []


def test_a_refused_or_failing_result_in_a_batch_goes_on_as_it_would_alone(make_engine_rt):
    """The first projection fails (a retry follows, as for a job run alone), a job whose cancel
    was asked before its result ends cancelled, and the others' results stand."""
    synthetic = fast_registry().get('synthetic')
    engine_rt = make_engine_rt(dataclasses.replace(synthetic, projector='flaky'))
    projector = FlakyProjector()
    engine_rt.ai.projectors.add(projector)
    ids = [create_job(engine_rt).id for _ in range(4)]
    engine = ExecutionEngine(engine_rt, 'worker-batch')
    original = engine.calls.call

    def call_then_cancel_the_third(a, resolved, call_no):
        result = original(a, resolved, call_no)
        if a.job.id == ids[2]:
            engine_rt.lifecycle.request_cancel(ids[2])  # after the call, before the commit
        return result

    engine.calls.call = call_then_cancel_the_third
    statuses = engine.execute_batch(ids)
    assert statuses == {
        ids[0]: 'succeeded',
        ids[1]: 'succeeded',
        ids[2]: 'cancelled',
        ids[3]: 'succeeded',
    }
    first = AiJob.get_by_id(ids[0])
    assert (first.retry_count, first.attempt_no) == (1, 1)
    assert [u.error_code for u in usage_rows(ids[0])] == ['INTERNAL_PROJECTION_FAILED', None]
    for job_id in (ids[1], ids[3]):
        assert [u.error_code for u in usage_rows(job_id)] == [None]
        assert AiJobArtifact.select().where(AiJobArtifact.job_id == job_id).count() == 1
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == ids[2]).count() == 0
    assert engine.held_attempts() == []


def test_a_batch_costs_the_same_statements_whatever_its_size(engine_rt):
    """The lock is one statement for the batch, and the writes of every success (the fenced
    terminal UPDATE, artifact, link, usage, terminal event, history) go out as one statement
    per table for the group: a bigger batch adds none."""

    def statements_for(count):
        ids = [create_job(engine_rt).id for _ in range(count)]
        engine_rt.dispatcher.marks.flush()  # the creates' published marks, not the batch's
        engine = ExecutionEngine(engine_rt, 'worker-%d' % count)
        before = engine_rt.store.statement_count()
        # One commit for the batch however slow the machine: by default a batch also commits
        # 50 ms after its first success, which a loaded CI machine once split 8 jobs over.
        assert set(engine.execute_batch(ids, flush_after_s=60).values()) == {'succeeded'}
        return engine_rt.store.statement_count() - before

    assert statements_for(8) == statements_for(2)


def test_a_batchs_terminal_updates_and_admission_releases_go_after_its_other_rows(
    engine_rt, monkeypatch
):
    """A batch's final transaction sends its other rows (artifacts, usage, outbox events,
    history) first and its fenced terminal UPDATEs, with the admission releases, last: those
    lock the jobs and their users' admission rows, which the users' creates wait for, until
    the COMMIT."""
    ids = [create_job(engine_rt, user_id='user-%d' % (i % 2)).id for i in range(4)]
    sent = record_sent_statements(monkeypatch, engine_rt.store)
    statuses = ExecutionEngine(engine_rt, 'worker-order').execute_batch(ids)
    assert set(statuses.values()) == {'succeeded'}
    [final] = [texts for texts in sent if any(t.startswith('UPDATE ai_job') for t in texts)]
    first = next(i for i, text in enumerate(final) if text.startswith('UPDATE ai_job'))
    assert any(text.startswith('INSERT INTO ai_job_event') for text in final[:first])
    assert not any(text.startswith('INSERT') for text in final[first:])  # nothing but the finish
    assert any(text.startswith('UPDATE ai_user_admission') for text in final[first:])
    assert AiUserAdmission.select(fn.SUM(AiUserAdmission.active)).scalar() == 0


@pytest.mark.parametrize('new_holder_status', ['running', 'succeeded', 'failed'])
def test_a_batch_member_whose_lock_was_taken_writes_nothing_and_the_others_commit(
    engine_rt, new_holder_status
):
    """Fencing holds in a group: a job taken over by another worker while this one ran it (a
    zombie), whether the new holder still runs it or has finished it, is abandoned, its result
    dropped and its cost kept; the rest of the group stands."""
    ids = [create_job(engine_rt).id for _ in range(3)]
    engine = ExecutionEngine(engine_rt, 'worker-zombie')
    original = engine.calls.call

    def call_then_lose_the_second(a, resolved, call_no):
        result = original(a, resolved, call_no)
        if a.job.id == ids[1]:  # another worker's lock now (a takeover, attempt + 1)
            AiJob.update(
                locked_by='worker-live',
                attempt_no=AiJob.attempt_no + 1,
                lifecycle_status=new_holder_status,
            ).where(AiJob.id == ids[1]).execute()
        return result

    engine.calls.call = call_then_lose_the_second
    statuses = engine.execute_batch(ids)
    assert statuses == {ids[0]: 'succeeded', ids[1]: None, ids[2]: 'succeeded'}
    lost = AiJob.get_by_id(ids[1])
    assert (lost.lifecycle_status, lost.locked_by, lost.output_hash) == (
        new_holder_status,
        'worker-live',
        None,
    )
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == ids[1]).count() == 0
    assert [u.error_code for u in usage_rows(ids[1])] == ['INTERNAL_ATTEMPT_ABANDONED']
    assert engine.held_attempts() == []


def test_after_commit_runs_once_per_group_with_the_committed_works_only(runtime):
    """What must follow a commit (the creates' pushes) runs once per committed group, with what
    each committed work returned: not the rolled-back work's, and before run returns."""
    store = runtime.store
    calls = []
    group = GroupCommit(store, after_commit=lambda outputs: calls.append(list(outputs)))

    def returning(job_id, fail=False):
        write = event_work(store, job_id, fail)

        def work(tx):
            write(tx)
            return job_id

        return work

    with store.connection():
        outcomes = group.run([returning('a'), returning('b', fail=True), returning('c')])
    assert outcomes[0] is None and isinstance(outcomes[1], ValueError) and outcomes[2] is None
    assert calls == [['a', 'c']]


def test_the_next_group_commits_while_after_commit_runs_and_no_caller_returns_before_it(runtime):
    """A group's after_commit (a push to the queue) runs after the group gave up the lead: a
    create arriving meanwhile commits without waiting for it. The group's own callers still
    return only once it ran."""
    store = runtime.store
    pushing, release, order = threading.Event(), threading.Event(), []

    def after_commit(outputs):
        if 'first' in outputs:
            pushing.set()
            assert release.wait(10)
        order.append(('pushed', list(outputs)))

    group = GroupCommit(store, after_commit=after_commit)

    def run(job_id):
        def work(tx):
            event_work(store, job_id)(tx)
            return job_id

        with store.connection():
            assert group.run([work]) == [None]
        order.append(('returned', job_id))

    first = threading.Thread(target=run, args=('first',))
    first.start()
    assert pushing.wait(10)
    second = threading.Thread(target=run, args=('second',))
    second.start()
    second.join(10)  # led its own group while the first group's push was held up
    assert order == [('pushed', ['second']), ('returned', 'second')]
    release.set()
    first.join(10)
    assert order[2:] == [('pushed', ['first']), ('returned', 'first')]


def test_a_failing_after_commit_leaves_the_committed_works_committed(runtime):
    store = runtime.store

    def boom(outputs):
        raise RuntimeError('the queue is down')

    group = GroupCommit(store, after_commit=boom)
    with store.connection():
        assert group.run([event_work(store, 'kept')]) == [None]
        assert events('kept') == 1


def test_creates_of_several_threads_push_each_claimed_event_once(runtime):
    """The creates of concurrent threads commit in groups, their rows written together, and
    each group's claimed events go to the queue in one push: every job is queued exactly once,
    and what each create returns (the job's creation time, its event's id) is its own row's."""
    pushed = []
    runtime.service.dispatch_now = PushNow(pushed.extend)
    jobs, errors = [], []

    def thread(n):
        try:
            with runtime.store.connection():
                for i in range(10):
                    jobs.append(create_job(runtime, user_id='gp-%d' % n, target_id=str(i)))
        except Exception as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=thread, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(jobs) == 40
    assert sorted(e.aggregate_id for e in pushed) == sorted(job.id for job in jobs)
    with runtime.store.connection():
        for event in pushed:
            assert OutboxEvent.get_by_id(event.id).aggregate_id == event.aggregate_id
        for job in jobs:
            assert AiJob.get_by_id(job.id).created_at == job.created_at


def test_one_group_at_a_time_when_an_earlier_group_ends_during_the_next(runtime):
    """The lead passes from group to group: a group whose after_commit ends while the next
    group is committing does not free the lead for a third (that ran two groups' transactions
    at once, and one group's admission counts missed the other's creates)."""
    store = runtime.store
    pushing, release_push = threading.Event(), threading.Event()
    in_second, release_second = threading.Event(), threading.Event()
    running, most, lock = [0], [0], threading.Lock()

    def after_commit(outputs):
        if 'first' in outputs:
            pushing.set()
            assert release_push.wait(10)

    group = GroupCommit(store, after_commit=after_commit)

    def run(job_id):
        def work(tx):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            if job_id == 'second':
                in_second.set()
                assert release_second.wait(10)
            event_work(store, job_id)(tx)
            with lock:
                running[0] -= 1
            return job_id

        with store.connection():
            assert group.run([work]) == [None]

    names = ('first', 'second', 'third')
    threads = {name: threading.Thread(target=run, args=(name,)) for name in names}
    threads['first'].start()
    assert pushing.wait(10)
    threads['second'].start()
    assert in_second.wait(10)
    release_push.set()
    threads['first'].join(10)  # the first group ended while the second is committing
    threads['third'].start()
    time.sleep(0.2)  # room for the third to begin a group of its own, were the lead free
    release_second.set()
    for thread in threads.values():
        thread.join(10)
    assert most[0] == 1
    with store.connection():
        assert [events(name) for name in names] == [1, 1, 1]
