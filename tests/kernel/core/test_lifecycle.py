"""AiJobLifecycleRepository: the state machine of contracts §1 as compare-and-set writes."""

import ast
import itertools
import pathlib
import re
import time

import pytest

from engine.core.errors import (
    IllegalTransitionError,
    JobAlreadyCancelledError,
    JobCancelledError,
    JobLockConflictError,
    JobNotCancellableError,
    ProviderError,
)
from engine.core.fences import ExpiredLockFence, Fence
from engine.core.models import AiJob, AiJobEvent
from tests.support import paths
from tests.support.helpers import create_job, row, run_threads

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects

STATES = ('queued', 'running', 'succeeded', 'failed', 'cancelled')
# contracts §1.2, plus running → running as a lock takeover (architecture decision 4). Written out
# here, not imported, so the test pins the specification rather than the code's own table.
LEGAL = {
    ('queued', 'running'),
    ('queued', 'cancelled'),
    ('running', 'running'),
    ('running', 'succeeded'),
    ('running', 'failed'),
    ('running', 'cancelled'),
}


def job_in_state(runtime, state):
    """A job brought to ``state`` through the repository; a running one has an expired lock."""
    repo = runtime.lifecycle
    job = create_job(runtime)
    if state == 'queued':
        return job
    if state == 'cancelled':
        return repo.mark_cancelled(job.id)
    job = repo.lock_job(job.id, 'worker-1', lock_ttl_ms=1)
    time.sleep(0.02)  # the lock expires: a takeover is possible
    fence = Fence('worker-1', job.attempt_no)
    if state == 'succeeded':
        repo.mark_succeeded(job.id, fence=fence, output_hash='h')
    if state == 'failed':
        repo.mark_failed(job.id, ProviderError('boom'), fence=fence)
    return repo.get(job.id)


def attempt(repo, job, to_status):
    fence = Fence(job.locked_by or 'worker-1', job.attempt_no)
    if to_status == 'cancelled':
        if job.lifecycle_status != 'running':
            return repo.transition(job.id, 'cancelled')
        repo.request_cancel(job.id)
    return repo.transition(
        job.id, to_status, instance_id='worker-2', fence=fence, error=ProviderError('boom')
    )


@pytest.mark.parametrize('from_status,to_status', list(itertools.product(STATES, STATES)))
def test_every_pair_of_states(runtime, from_status, to_status):
    job = job_in_state(runtime, from_status)
    assert job.lifecycle_status == from_status
    before = row(AiJob, job.id)
    if (from_status, to_status) in LEGAL:
        assert attempt(runtime.lifecycle, job, to_status).lifecycle_status == to_status
    else:
        with pytest.raises(IllegalTransitionError):
            attempt(runtime.lifecycle, job, to_status)
        assert row(AiJob, job.id) == before


def test_lock_job_sets_lock_fields_from_the_database_clock(runtime):
    job = create_job(runtime)
    locked = runtime.lifecycle.lock_job(job.id, 'worker-1', lock_ttl_ms=60_000)
    assert locked.locked_by == 'worker-1' and locked.attempt_no == 1
    assert locked.started_at is not None and locked.locked_at is not None
    ttl = (locked.lock_until - locked.locked_at).total_seconds()
    assert 59 <= ttl <= 61


def test_eight_threads_racing_for_one_job_one_wins(runtime):
    job = create_job(runtime)
    results, errors = run_threads(
        8, lambda i: runtime.lifecycle.lock_job(job.id, 'worker-%d' % i), runtime.store
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert all(isinstance(e, JobLockConflictError) for e in errors if e is not None)
    assert sum(e is not None for e in errors) == 7
    assert AiJob.get_by_id(job.id).locked_by == winners[0].locked_by


def test_a_live_lock_cannot_be_taken_over(runtime):
    job = create_job(runtime)
    runtime.lifecycle.lock_job(job.id, 'worker-1', lock_ttl_ms=60_000)
    with pytest.raises(JobLockConflictError):
        runtime.lifecycle.lock_job(job.id, 'worker-2')


def test_takeover_stops_when_the_queue_attempts_are_used(runtime):
    job = create_job(runtime)  # ai-interactive: 2 attempts
    for worker in ('worker-1', 'worker-2'):
        runtime.lifecycle.lock_job(job.id, worker, lock_ttl_ms=1)
        time.sleep(0.02)
    with pytest.raises(JobLockConflictError):
        runtime.lifecycle.lock_job(job.id, 'worker-3')
    assert AiJob.get_by_id(job.id).attempt_no == 2


def test_a_zombie_cannot_finish_a_job_taken_over(runtime):
    repo = runtime.lifecycle
    job = create_job(runtime)
    first = repo.lock_job(job.id, 'worker-1', lock_ttl_ms=1)
    time.sleep(0.02)
    second = repo.lock_job(job.id, 'worker-2')
    zombie = Fence('worker-1', first.attempt_no)
    for write in (
        lambda: repo.mark_succeeded(job.id, fence=zombie),
        lambda: repo.mark_failed(job.id, ProviderError('x'), fence=zombie),
        lambda: repo.set_progress(job.id, zombie, 50),
    ):
        with pytest.raises(JobLockConflictError):
            write()
    current = AiJob.get_by_id(job.id)
    assert (current.lifecycle_status, current.locked_by, current.progress) == (
        'running',
        'worker-2',
        0,
    )
    repo.mark_succeeded(job.id, fence=Fence('worker-2', second.attempt_no))
    assert repo.get(job.id).progress == 100


def test_heartbeat_extends_the_lock_and_reports_a_cancel_request(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1', lock_ttl_ms=1000)
    fence = Fence('worker-1', job.attempt_no)
    holders = repo.extend_locks([job.id], 'worker-1', lock_ttl_ms=60_000)
    assert holders == {job.id: ('running', 'worker-1', fence.attempt_no, None)}
    assert repo.get(job.id).lock_until > job.lock_until
    repo.mark_cancelled(job.id)  # owner cancels a running job
    [(_, _, _, cancel_requested_at)] = repo.extend_locks([job.id], 'worker-1').values()
    assert cancel_requested_at is not None


def test_a_zombie_heartbeat_extends_nothing_and_sees_the_new_holder(runtime):
    repo = runtime.lifecycle
    job = create_job(runtime)
    first = repo.lock_job(job.id, 'worker-1', lock_ttl_ms=1)
    time.sleep(0.02)
    second = repo.lock_job(job.id, 'worker-2', lock_ttl_ms=60_000)
    before = repo.get(job.id).lock_until
    holders = repo.extend_locks([job.id], 'worker-1', lock_ttl_ms=120_000)
    assert holders[job.id][1:3] == ('worker-2', second.attempt_no) != ('worker-1', first.attempt_no)
    assert repo.get(job.id).lock_until == before


def test_cancel_while_running_is_a_request_until_the_engine_finishes_it(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1')
    fence = Fence('worker-1', job.attempt_no)
    requested = repo.mark_cancelled(job.id)
    assert requested.lifecycle_status == 'running' and requested.cancel_requested_at
    assert repo.mark_cancelled(job.id).lifecycle_status == 'running'  # idempotent
    with pytest.raises(JobCancelledError):
        repo.mark_succeeded(job.id, fence=fence)  # never succeeded
    repo.mark_cancelled(job.id, fence=fence)
    done = repo.get(job.id)
    assert (done.lifecycle_status, done.error_code) == ('cancelled', 'CANCELLED')
    with pytest.raises(JobAlreadyCancelledError):
        repo.mark_cancelled(job.id)


def test_cancel_of_a_finished_job_is_refused(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1')
    repo.mark_succeeded(job.id, fence=Fence('worker-1', job.attempt_no))
    with pytest.raises(JobNotCancellableError):
        repo.mark_cancelled(job.id)


def test_find_expired_locks_and_the_reaper_fence(runtime):
    repo = runtime.lifecycle
    live = repo.lock_job(create_job(runtime, target_id='a').id, 'worker-1', lock_ttl_ms=60_000)
    dead = repo.lock_job(create_job(runtime, target_id='b').id, 'worker-2', lock_ttl_ms=1)
    time.sleep(0.05)
    expired = repo.find_expired_locks(threshold_ms=20)
    assert [job.id for job in expired] == [dead.id]
    assert repo.find_expired_locks(threshold_ms=60_000) == []
    with pytest.raises(JobLockConflictError):  # the live lock is not reapable
        repo.mark_failed(live.id, ProviderError('x'), fence=ExpiredLockFence(live.attempt_no, 20))
    repo.mark_failed(dead.id, ProviderError('lost'), fence=ExpiredLockFence(dead.attempt_no, 20))
    assert repo.get(dead.id).lifecycle_status == 'failed'


def test_find_by_lifecycle_status(runtime):
    repo = runtime.lifecycle
    queued = create_job(runtime, target_id='a')
    running = repo.lock_job(create_job(runtime, target_id='b').id, 'worker-1')
    assert [j.id for j in repo.find_by_lifecycle_status(['queued'])] == [queued.id]
    assert {j.id for j in repo.find_by_lifecycle_status(['queued', 'running'])} == {
        queued.id,
        running.id,
    }
    assert repo.find_by_lifecycle_status(['running'], queue_name='ai-background') == []


def test_every_terminal_state_records_when_it_finished(runtime):
    repo = runtime.lifecycle
    cancelled = repo.mark_cancelled(create_job(runtime, target_id='queued').id)
    assert cancelled.finished_at is not None and cancelled.lock_until is None
    for state in ('succeeded', 'failed'):
        assert job_in_state(runtime, state).finished_at is not None


def test_progress_never_goes_back_within_a_job(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1', lock_ttl_ms=1)
    repo.set_progress(job.id, Fence('worker-1', job.attempt_no), 20)
    time.sleep(0.02)
    taken = repo.lock_job(job.id, 'worker-2')  # a takeover starts its own count from 0
    repo.set_progress(job.id, Fence('worker-2', taken.attempt_no), 10)
    assert repo.get(job.id).progress == 20
    repo.set_progress(job.id, Fence('worker-2', taken.attempt_no), 60)
    assert repo.get(job.id).progress == 60


def test_lock_jobs_locks_a_batch_in_one_statement_and_returns_only_what_it_locked(runtime):
    repo = runtime.lifecycle
    free = [create_job(runtime) for _ in range(3)]
    taken = create_job(runtime)
    repo.lock_job(taken.id, 'worker-2')  # a live lock of another worker
    done = job_in_state(runtime, 'succeeded')
    ids = [free[0].id, taken.id, free[1].id, done.id, free[2].id, 'no-such-job', free[0].id]
    before = runtime.store.statement_count()
    locked = repo.lock_jobs(ids, 'worker-1')
    # BEGIN, the UPDATE, one read (SQLite: RETURNING, then the snapshots), one INSERT of the
    # three history rows, COMMIT
    assert runtime.store.statement_count() - before == 5
    started = AiJobEvent.select().where(
        AiJobEvent.job_id.in_([j.id for j in free]) & (AiJobEvent.kind == 'started')
    )
    assert sorted((e.job_id, e.kind, e.attempt_no) for e in started) == sorted(
        (j.id, 'started', 1) for j in free
    )
    assert [job.id for job, _ in locked] == [j.id for j in free]
    for job, snapshot in locked:
        assert (job.lifecycle_status, job.locked_by, job.attempt_no) == ('running', 'worker-1', 1)
        assert snapshot['input'] == {}
        assert repo.get(job.id).lifecycle_status == 'running'
    assert repo.get(taken.id).locked_by == 'worker-2'
    assert repo.lock_jobs([j.id for j in free], 'worker-1') == []  # live locks, its own too


def test_lock_jobs_tells_its_own_rows_from_locks_the_same_worker_held_before(runtime):
    """A job this worker locked earlier (still running, its lock live) is not taken again by a
    later batch of the same worker: only the rows this batch changed come back, with the new
    attempt as the fence."""
    repo = runtime.lifecycle
    held = create_job(runtime)
    repo.lock_job(held.id, 'worker-1')
    expired = create_job(runtime)
    repo.lock_job(expired.id, 'worker-1', lock_ttl_ms=1)
    fresh = create_job(runtime)
    time.sleep(0.02)
    locked = repo.lock_jobs([held.id, expired.id, fresh.id], 'worker-1')
    assert [(job.id, job.attempt_no) for job, _ in locked] == [(expired.id, 2), (fresh.id, 1)]
    assert repo.get(held.id).attempt_no == 1


def test_lock_jobs_racing_workers_lock_each_job_once(runtime):
    ids = [create_job(runtime).id for _ in range(20)]

    def lock(i):
        return [job.id for job, _ in runtime.lifecycle.lock_jobs(ids, 'w%d' % i)]

    results, errors = run_threads(4, lock, runtime.store)
    assert errors == [None] * 4
    everything = [job_id for locked in results for job_id in locked]
    assert sorted(everything) == sorted(ids)
    for i, locked in enumerate(results):
        assert all(runtime.lifecycle.get(job_id).locked_by == 'w%d' % i for job_id in locked)


# ---------------------------------------------------------------- the only writer (contracts §1.4)
ENGINE = pathlib.Path(paths.ROOT) / 'engine'
# A SQL text that sets the column: ``lifecycle_status =`` before any WHERE (a read compares it after
# one), in anything but a SELECT.
SETS_STATUS = re.compile(r'\blifecycle_status\s*=', re.I)
PEEWEE_WRITES = ('update', 'create', 'insert', 'insert_many', 'replace')


def writes_status(node):
    """Does this piece of a module write ``lifecycle_status``? SQL text that sets it, a peewee
    write naming it (``AiJob.update({AiJob.lifecycle_status: …})``, ``update(lifecycle_status=…)``)
    or an assignment to a row's attribute."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        before_where = re.split(r'\bWHERE\b', text, maxsplit=1, flags=re.I)[0]
        return not text.lstrip().upper().startswith('SELECT') and bool(
            SETS_STATUS.search(before_where)
        )
    if isinstance(node, ast.Dict):
        return any(
            isinstance(key, ast.Attribute) and key.attr == 'lifecycle_status' for key in node.keys
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        named = any(keyword.arg == 'lifecycle_status' for keyword in node.keywords)
        return named and node.func.attr in PEEWEE_WRITES
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(
            isinstance(target, ast.Attribute) and target.attr == 'lifecycle_status'
            for target in targets
        )
    return False


def test_only_the_lifecycle_repository_writes_a_status():
    """The repository is one class in several modules (core/lifecycle.py and its parts); no other
    engine module changes the column. Its own writes are found, so the search sees them (the
    create's INSERT names its columns in a list: creation goes through ``create_job``)."""
    writers = sorted(
        str(path.relative_to(ENGINE))
        for path in ENGINE.rglob('*.py')
        if any(writes_status(node) for node in ast.walk(ast.parse(path.read_text())))
    )
    # The lock's and the terminal writes' SET clauses, and the cancels of a job nobody holds.
    assert writers == ['core/lifecycle_cancel.py', 'core/lifecycle_sql.py']
