"""``python aijob.py bench --jobs N``: end-to-end throughput and latency on the configured
backends, measured honestly: N synthetic no-op jobs created through AiJobService, run by one
worker process with the default pools, timed from the first create to the last terminal state.

Latencies come from the database's own timestamps (created_at → started_at, one clock). Commits
are counted by each process's store (explicit COMMITs plus autocommit writes) and summed.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from .core.lifecycle import TERMINAL
from .core.models import AiJob
from .core.service import CreateJobInput
from .runtime import Runtime

CREATORS = 4  # client threads creating jobs, as several web requests would


def run_bench(config, jobs, rate=0):
    """``rate`` > 0 paces creation at that many jobs per second (latency below saturation);
    0 creates them all at once (throughput, where create→running is mostly queueing)."""
    runtime = Runtime(config, role='bench')
    runtime.create_schema()
    worker = _start_worker(runtime)
    try:
        commits_before = runtime.store.commit_count()
        ids = _create(runtime, jobs, rate)
        _wait_terminal(runtime, ids, timeout_s=max(60.0, jobs * 0.2))
        creator_commits = runtime.store.commit_count() - commits_before
    finally:
        worker_commits = worker.stop()
    figures = _figures(runtime, ids, creator_commits + worker_commits, rate)
    for name, value in figures.items():
        print('%s: %s' % (name, value))
    print(
        'e2e_jobs_per_s=%(e2e_jobs_per_s).1f create_to_running_p50_ms=%(p50).2f '
        'create_to_running_p99_ms=%(p99).2f commits_per_job=%(commits_per_job).2f '
        'succeeded=%(succeeded)d/%(jobs)d' % figures
    )
    runtime.close()
    return 0 if figures['succeeded'] == jobs else 1


def _create(runtime, jobs, rate):
    ids = [None] * jobs
    started = time.monotonic()

    def creator(offset):
        with runtime.store.connection():
            for i in range(offset, jobs, CREATORS):
                if rate:
                    time.sleep(max(0.0, started + i / rate - time.monotonic()))
                request = CreateJobInput(
                    user_id='bench-%d' % i,
                    job_type='synthetic',
                    target_type='bench',
                    target_id=str(i),
                    input={},
                )
                ids[i] = runtime.service.create_job(request).job.id

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(CREATORS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ids


def _wait_terminal(runtime, ids, timeout_s):
    deadline = time.monotonic() + timeout_s
    with runtime.store.connection():
        while time.monotonic() < deadline:
            done = (
                AiJob.select()
                .where(AiJob.id.in_(ids) & AiJob.lifecycle_status.in_(list(TERMINAL)))
                .count()
            )
            if done == len(ids):
                return
            time.sleep(0.05)
    raise SystemExit('bench: not every job finished within %.0fs' % timeout_s)


def _figures(runtime, ids, commits, rate):
    with runtime.store.connection():
        rows = list(
            AiJob.select(
                AiJob.lifecycle_status, AiJob.created_at, AiJob.started_at, AiJob.finished_at
            ).where(AiJob.id.in_(ids))
        )
    waits = sorted(
        (r.started_at - r.created_at).total_seconds() * 1000 for r in rows if r.started_at
    )
    wall_s = (max(r.finished_at for r in rows) - min(r.created_at for r in rows)).total_seconds()
    return {
        'backends': '%s + %s'
        % (runtime.store.dialect, 'redis' if runtime.config.uses_redis else 'memory'),
        'creation': 'paced at %s jobs/s' % rate
        if rate
        else 'all at once (%d client threads)' % CREATORS,
        'jobs': len(ids),
        'wall_s': round(wall_s, 3),
        'e2e_jobs_per_s': len(ids) / wall_s if wall_s else float('inf'),
        'p50': statistics.median(waits),
        'p99': waits[min(len(waits) - 1, int(len(waits) * 0.99))],
        'commits_per_job': commits / len(ids),
        'succeeded': sum(r.lifecycle_status == 'succeeded' for r in rows),
    }


def _start_worker(runtime):
    if runtime.config.uses_redis:
        return _WorkerProcess(runtime)
    return _InProcessWorker(runtime)


class _InProcessWorker:
    """SQLite + in-memory queue cannot cross processes: the worker runs in this one."""

    def __init__(self, runtime):
        self.runtime = runtime
        print('worker: in-process (in-memory queue)')
        runtime.start_background()

    def stop(self):
        self.runtime.stop_background(timeout_s=10)
        return 0  # this process's counter already includes the worker


class _WorkerProcess:
    """``python aijob.py worker`` as a child; its commit count comes from its stop log line."""

    def __init__(self, runtime):
        self.log = tempfile.NamedTemporaryFile(
            prefix='aijob-bench-worker-', suffix='.log', delete=False
        )
        entry = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'aijob.py'
        )
        self.process = subprocess.Popen(
            [sys.executable, entry, 'worker'], stdout=self.log, stderr=self.log
        )
        print('worker: process %d' % self.process.pid)
        self._wait_ready(runtime)

    def _wait_ready(self, runtime):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit('bench: the worker exited at start; see %s' % self.log.name)
            if b'worker.started' in open(self.log.name, 'rb').read():
                return
            time.sleep(0.05)
        raise SystemExit('bench: the worker did not start; see %s' % self.log.name)

    def stop(self):
        self.process.terminate()
        self.process.wait(60)
        for line in open(self.log.name, encoding='utf-8', errors='replace'):
            if '"worker.stopped"' in line:
                commits = json.loads(line).get('commits', 0)
                os.unlink(self.log.name)
                return commits
        raise SystemExit('bench: no commit count from the worker; see %s' % self.log.name)
