"""Crash recovery with real worker processes (architecture decisions 1, 3 and 4): kill -9 mid-job,
zombie workers, a Redis that loses its data, and the ordered SIGTERM shutdown."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine.core.history import JobHistory
from engine.core.models import AiJob, AiJobArtifact, AiUsageLog
from engine.execution.engine import ExecutionEngine
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers
from tests.support.helpers import create_job, wait_until
from tests.support.paths import ROOT
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_rt(backend, make_runtime):
    """A runtime whose queue is Redis on either database, so worker processes can share it
    (SQLite's file is shared by processes as well)."""
    require_servers('redis')
    rt = make_runtime(AIJOB_REDIS_URL=REDIS_URL, **FAST_SETTINGS)
    rt.env = backend.env(AIJOB_REDIS_URL=REDIS_URL, **FAST_SETTINGS)
    with rt.store.connection():
        yield rt
    delete_redis_keys(backend.prefix)


class WorkerProcess:
    def __init__(self, env, **extra):
        self.log_path = '/tmp/aijob-test-worker-%d.log' % time.monotonic_ns()
        self.log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(
            [sys.executable, 'aijob.py', 'worker'],
            cwd=ROOT,
            env={**os.environ, **env, **extra},
            stdout=self.log,
            stderr=self.log,
        )
        wait_until(
            lambda: (
                b'worker.started' in open(self.log_path, 'rb').read()
                or self.proc.poll() is not None
            ),
            timeout=20,
        )
        assert self.proc.poll() is None, open(self.log_path).read()

    def owns(self, job):
        return job.locked_by is not None and (':%d:' % self.proc.pid) in job.locked_by

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        return self.proc.wait(timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        if os.environ.get('KEEP_WORKER_LOGS') is None:
            os.unlink(self.log_path)


@pytest.fixture
def workers():
    started = []

    def start(env, **extra):
        started.append(WorkerProcess(env, **extra))
        return started[-1]

    yield start
    for worker in started:
        worker.close()


def running_on(worker, job_id):
    job = AiJob.get_by_id(job_id)
    return job.lifecycle_status == 'running' and worker.owns(job)


def test_a_killed_worker_s_job_is_taken_over_by_another(shared_rt, workers):
    first = workers(shared_rt.env)
    job = create_job(shared_rt, input={'sleepMs': 2500})
    wait_until(lambda: running_on(first, job.id))
    first.kill()
    second = workers(shared_rt.env)
    done = wait_terminal(shared_rt, job.id, timeout=30)
    assert (done.lifecycle_status, done.attempt_no) == ('succeeded', 2)
    assert second.owns(done)
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 1


def test_a_job_whose_attempts_are_used_up_fails_worker_lost(shared_rt, workers):
    job = create_job(shared_rt, input={'sleepMs': 20_000})  # ai-interactive: 2 attempts
    for _ in range(2):
        worker = workers(shared_rt.env)
        wait_until(lambda w=worker: running_on(w, job.id), timeout=30)
        worker.kill()
    wait_until(
        lambda: shared_rt.reaper.sweep() and AiJob.get_by_id(job.id).lifecycle_status != 'running',
        timeout=30,
        interval=0.2,
    )
    done = AiJob.get_by_id(job.id)
    assert (done.lifecycle_status, done.error_code, done.attempt_no) == (
        'failed',
        'INTERNAL_WORKER_LOST',
        2,
    )


def test_sigterm_lets_a_running_job_finish_then_exits(shared_rt, workers):
    worker = workers(shared_rt.env)
    job = create_job(shared_rt, input={'sleepMs': 1000})
    wait_until(lambda: running_on(worker, job.id))
    worker.kill(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert AiJob.get_by_id(job.id).lifecycle_status == 'succeeded'


def test_sigterm_hands_back_what_outlives_the_grace_period(shared_rt, workers):
    worker = workers(shared_rt.env, AIJOB_SHUTDOWN_GRACE_MS='300')
    job = create_job(shared_rt, input={'sleepMs': 2000})
    wait_until(lambda: running_on(worker, job.id))
    worker.kill(signal.SIGTERM)
    assert worker.wait(15) == 0
    handed_back = AiJob.get_by_id(job.id)
    assert handed_back.lifecycle_status == 'running'  # never running → queued
    successor = workers(shared_rt.env)
    done = wait_terminal(shared_rt, job.id, timeout=30)
    assert (done.lifecycle_status, done.attempt_no) == ('succeeded', 2) and successor.owns(done)


def test_a_second_sigterm_exits_at_once(shared_rt, workers):
    worker = workers(shared_rt.env)
    job = create_job(shared_rt, input={'sleepMs': 20_000})
    wait_until(lambda: running_on(worker, job.id))
    worker.kill(signal.SIGTERM)
    time.sleep(0.3)
    worker.kill(signal.SIGTERM)
    assert worker.wait(5) == 3


def test_the_worker_refuses_to_start_without_redis(backend):
    result = subprocess.run(
        [sys.executable, 'aijob.py', 'worker'],
        cwd=ROOT,
        timeout=60,
        env=dict(os.environ, **backend.env(AIJOB_REDIS_URL='')),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert 'AIJOB_REDIS_URL' in result.stderr and 'Traceback' not in result.stderr
    assert result.stderr.strip().count('\n') == 0


def test_a_queue_that_comes_back_empty_is_noticed_at_once_not_after_the_reconcile_delay(
    make_runtime, backend
):
    settings = dict(
        FAST_SETTINGS, AIJOB_RECONCILE_AFTER_MS='600000', AIJOB_INTERACTIVE_CONCURRENCY='1'
    )
    rt = make_runtime(registry=fast_registry(), **settings)
    with rt.store.connection():
        rt.start_background()
        busy = create_job(rt, input={'sleepMs': 1500})  # holds the only thread
        wait_until(lambda: AiJob.get_by_id(busy.id).lifecycle_status == 'running')
        waiting = [create_job(rt, user_id='w%d' % i, target_id=str(i)) for i in range(10)]
        if rt.config.uses_redis:  # Redis restarts without persistence …
            delete_redis_keys(backend.prefix)
        else:
            rt.queue.clear()
        for job in [busy] + waiting:  # … and every job still runs, once, long before 600 s
            done = wait_terminal(rt, job.id, timeout=15)
            assert (done.lifecycle_status, done.attempt_no) == ('succeeded', 1)


def test_a_zombie_whose_lock_was_taken_over_cannot_succeed(engine_rt):
    job = create_job(engine_rt, input={'sleepMs': 2500})  # lock TTL 1.5 s, no heartbeat
    zombie, successor = (ExecutionEngine(engine_rt, name) for name in ('worker-a', 'worker-b'))
    outcome = {}

    def run(engine, name):
        with engine_rt.store.connection():
            outcome[name] = engine.execute(job.id)

    first = threading.Thread(target=run, args=(zombie, 'zombie'))
    first.start()
    wait_until(lambda: AiJob.get_by_id(job.id).lifecycle_status == 'running')
    time.sleep(1.7)  # the zombie's lock expires
    run(successor, 'successor')
    first.join(10)
    assert outcome == {'zombie': None, 'successor': 'succeeded'}
    done = AiJob.get_by_id(job.id)
    assert (done.locked_by, done.attempt_no) == ('worker-b', 2)
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 1
    # The zombie's call cost what it cost: its usage row stands, marked, beside the successor's.
    usage = AiUsageLog.select().where(AiUsageLog.job_id == job.id).order_by(AiUsageLog.attempt_no)
    assert [(u.attempt_no, u.error_code) for u in usage] == [
        (1, 'INTERNAL_ATTEMPT_ABANDONED'),
        (2, None),
    ]


def test_jobs_survive_a_queue_that_lost_its_data(engine_rt, backend):
    engine_rt.service.dispatch_now = None
    jobs = [create_job(engine_rt, user_id='u%d' % i, target_id=str(i)) for i in range(20)]
    assert engine_rt.dispatcher.cycle() == 20  # published to the queue …
    if engine_rt.config.uses_redis:  # … which then loses everything
        delete_redis_keys(backend.prefix)
    else:
        engine_rt.queue.clear()
    assert engine_rt.queue.depth('ai-interactive') == 0
    engine_rt.start_background()
    for job in jobs:
        assert wait_terminal(engine_rt, job.id, timeout=30).lifecycle_status == 'succeeded'


def test_the_history_of_a_job_taken_over_after_a_kill_9(shared_rt, workers):
    first = workers(shared_rt.env)
    job = create_job(shared_rt, input={'sleepMs': 3000, 'progressSteps': 10})
    wait_until(lambda: running_on(first, job.id) and AiJob.get_by_id(job.id).progress >= 20)
    lost = AiJob.get_by_id(job.id).locked_by
    first.kill()
    first.wait(10)
    second = workers(shared_rt.env)
    done = wait_terminal(shared_rt, job.id, timeout=30)
    assert (done.lifecycle_status, done.attempt_no) == ('succeeded', 2) and second.owns(done)
    events = JobHistory(shared_rt.store).list(job.id)
    rows = [(e.kind, e.attempt_no, e.detail) for e in events]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert rows[0][:2] == ('created', 0) and rows[1][:2] == ('dispatched', 0)
    # The milestones of each attempt, in order; then what is left is the life itself.
    for attempt in (1, 2):
        progress = [d['progress'] for k, n, d in rows if k == 'progress' and n == attempt]
        assert progress == sorted(set(progress))
        assert all(p >= 10 for p in progress)
    assert any(k == 'progress' and n == 1 for k, n, _ in rows)
    life = [(k, n, d) for k, n, d in rows[2:] if k != 'progress']
    # The reaper's row is there unless the new worker took the job over first (both happen
    # right after the new leader moves the dead worker's message back).
    if life[1][0] == 'worker_lost':
        assert life.pop(1) == ('worker_lost', 1, {'worker': lost, 'by': 'reaper'})
    assert life == [
        ('started', 1, {'worker': lost}),
        ('taken_over', 2, {'worker': done.locked_by}),
        ('succeeded', 2, {'worker': done.locked_by}),
    ]
    # Progress rows sit inside their attempt: attempt 1's before the takeover, 2's after it.
    kinds_attempts = [(k, n) for k, n, _ in rows]
    takeover = kinds_attempts.index(('taken_over', 2))
    assert all(n == 1 for k, n in kinds_attempts[:takeover] if k == 'progress')
    assert all(n == 2 for k, n in kinds_attempts[takeover:] if k == 'progress')
