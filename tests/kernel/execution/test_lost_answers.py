"""Answers lost with the connection: the server ran a transaction's COMMIT (it travels with
the rows, docs/architecture.md decision 10) and the worker saw only an error. Nothing may be
stranded or written twice: a lock's jobs are adopted when their messages come back
(execution/unheard_locks.py), a terminal write finds its own fence's write (FinishWrittenError),
a retry counts once."""

import peewee
import pytest

from engine.core.models import AiJob, AiJobArtifact, AiJobEvent
from engine.execution.engine import ExecutionEngine
from engine.execution.unheard_locks import UnheardLocks
from tests.kernel.execution.test_execution import usage_rows
from tests.support.helpers import create_job

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def lost_connection():
    return peewee.OperationalError(2013, 'Lost connection to server during query')


def kinds(job_id):
    return [e.kind for e in AiJobEvent.select().where(AiJobEvent.job_id == job_id)]


def test_a_lock_whose_answer_was_lost_is_adopted_when_its_jobs_come_back(engine_rt, monkeypatch):
    """The store commits a batch lock and the connection drops before the worker reads its
    answer (execution/unheard_locks.py): the worker puts the messages back, and its lock of the
    redelivered ones runs the jobs it holds as they are (attempt 1, one ``started`` row), not
    after their locks expire. Another worker still gets nothing."""
    ids = [create_job(engine_rt).id for _ in range(2)]
    engine = ExecutionEngine(engine_rt, 'worker-deaf')
    lock_jobs = engine_rt.lifecycle.lock_jobs

    def committed_then_lost(*args, **kwargs):
        lock_jobs(*args, **kwargs)
        raise lost_connection()

    monkeypatch.setattr(engine_rt.lifecycle, 'lock_jobs', committed_then_lost)
    with pytest.raises(peewee.OperationalError):
        engine.execute_batch(ids)
    monkeypatch.undo()
    assert [AiJob.get_by_id(i).locked_by for i in ids] == ['worker-deaf'] * 2
    assert engine.held_attempts() == [] and engine.unheard_locks.unheard() == set(ids)

    def unreachable():
        raise peewee.OperationalError(2003, "Can't connect to server")

    monkeypatch.setattr(engine, '_unit', unreachable)  # a redelivery while the store is away
    with pytest.raises(peewee.OperationalError):
        engine.execute_batch(ids)
    monkeypatch.undo()
    assert engine.unheard_locks.unheard() == set(ids)  # still to adopt
    assert ExecutionEngine(engine_rt, 'worker-other').execute_batch(ids) == {}
    assert engine.execute_batch(ids) == {job_id: 'succeeded' for job_id in ids}
    for job_id in ids:
        job = AiJob.get_by_id(job_id)
        assert (job.lifecycle_status, job.attempt_no) == ('succeeded', 1)
        assert kinds(job_id).count('started') == 1 and 'taken_over' not in kinds(job_id)
    assert engine.unheard_locks.unheard() == set()


def test_a_group_commit_whose_answer_was_lost_leaves_its_jobs_finished_once(engine_rt, monkeypatch):
    """The store commits a group of finishes and the connection drops before the worker reads
    its answer: each job's write, tried again alone, finds its job finished under its own fence
    (FinishWrittenError) and is done, with every job, row and cost written once."""
    ids = [create_job(engine_rt).id for _ in range(3)]
    engine = ExecutionEngine(engine_rt, 'worker-deaf')
    run = engine.group_commit.run
    lost = []

    def committed_then_lost(works):
        outcomes = run(works)
        if not lost:
            lost.append(len(works))
            raise lost_connection()
        return outcomes

    monkeypatch.setattr(engine.group_commit, 'run', committed_then_lost)
    statuses = engine.execute_batch(ids, flush_after_s=0)
    assert lost and statuses == {job_id: 'succeeded' for job_id in ids}
    for job_id in ids:
        job = AiJob.get_by_id(job_id)
        assert (job.lifecycle_status, job.attempt_no) == ('succeeded', 1)
        assert kinds(job_id).count('succeeded') == 1
        assert AiJobArtifact.select().where(AiJobArtifact.job_id == job_id).count() == 1
        assert [u.error_code for u in usage_rows(job_id)] == [None]  # its cost counted once
    assert engine.held_attempts() == []


def test_an_unheard_lock_is_adopted_by_one_thread_and_never_beside_a_holder():
    book, held = UnheardLocks(), {}
    book.begin([1, 2, 3], held)
    book.begin([2], held)  # a duplicate message of 2, locked by another thread at once
    held[3] = 'a holding thread'  # 3 was this worker's already: the lost lock cannot take it
    book.lost([1, 2, 3], held)
    book.lost([2], held)  # both locks of 2 went unheard
    book.end([1, 2, 3])
    book.end([2])
    assert book.unheard() == {1, 2}
    other = book.begin([2], held)  # a thread locks 2 again, and adopts it
    assert book.begin([1, 2], held) == {1}  # 1 once; 2 not while another lock takes it
    assert book.begin([1], held) == set()
    book.end([2])
    book.end([1, 2])
    book.end([1])
    assert other == {2} and book.unheard() == set()


def test_a_retry_whose_answer_was_lost_counts_once(engine_rt, monkeypatch):
    """The write that schedules a retry commits unheard and is tried again: the job's retry
    count is the number of retries it had, not one more."""
    job = create_job(engine_rt, input={'failWith': 'PROVIDER_ERROR', 'failTimes': 1})
    engine = ExecutionEngine(engine_rt, 'worker-deaf')
    count_retry = engine_rt.lifecycle.count_retry
    lost = []

    def committed_then_lost(*args, **kwargs):
        count_retry(*args, **kwargs)
        if not lost:
            lost.append(True)
            raise lost_connection()

    monkeypatch.setattr(engine_rt.lifecycle, 'count_retry', committed_then_lost)
    assert engine.execute_batch([job.id]) == {job.id: 'succeeded'}
    done = AiJob.get_by_id(job.id)
    assert lost and (done.lifecycle_status, done.retry_count) == ('succeeded', 1)
