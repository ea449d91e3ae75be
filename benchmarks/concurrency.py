"""Many concurrent AI calls in one worker (issue 9 item 4), against MariaDB + Redis.

    python benchmarks/concurrency.py [--jobs 200] [--sleep-ms 2000] [--scenarios ...]

Starts ``python aijob.py worker`` with AIJOB_INTERACTIVE_CONCURRENCY=<jobs> and, per scenario,
creates <jobs> synthetic jobs at once through AiJobService (as many web requests would):

- ``throughput``: ``{"sleepMs": 2000}`` jobs; the wall time from the first create to the last
  success (database clock), the worker's peak RSS (VmHWM), every job succeeded, none taken over
  (attempt_no == 1), and how many ran at the same time.
- ``heartbeat``: AIJOB_LOCK_TTL_MS=3000, AIJOB_HEARTBEAT_MS=1000 and jobs long enough for several
  heartbeats; the smallest lock headroom (lock_until − now) seen over the running jobs, sampled,
  no job.lock_lost, none taken over.
- ``cancel``: cancels a quarter of the running jobs; each of them ends cancelled promptly (time
  from the cancel request to its terminal write), the rest succeed.
- ``shutdown``: SIGTERM while every job runs, once with jobs that finish within the grace period
  and once with jobs that outlast it (handed back); the worker exits 0 within the grace period
  (plus the hand-back), and after a new worker starts every job reaches a terminal state.

Uses its own database and Redis (defaults below; the database is created if missing, its tables
emptied at start) and stops only the workers it started, by pid.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pymysql  # noqa: E402
import redis  # noqa: E402

from engine.core.models import AiJob  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
from engine.core.states import TERMINAL  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

DATABASE_URL = 'mysql://root@127.0.0.1:3306/test_conc'
REDIS_URL = 'redis://127.0.0.1:6379/5'
CREATORS = 8  # client threads creating the jobs
SCENARIOS = ('throughput', 'heartbeat', 'cancel', 'shutdown')


def ensure_database(url):
    parts = urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname or '127.0.0.1',
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
        connect_timeout=5,
    )
    with conn.cursor() as cursor:
        cursor.execute(
            'CREATE DATABASE IF NOT EXISTS `%s` CHARACTER SET utf8mb4' % parts.path.strip('/')
        )
    conn.close()


class WorkerProcess:
    """One ``python aijob.py worker`` child, its log in a temporary file."""

    def __init__(self, env):
        self.log = tempfile.NamedTemporaryFile(prefix='aijob-conc-worker-', suffix='.log')
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, 'aijob.py'), 'worker'],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.process.pid
        deadline = time.monotonic() + 30
        while b'worker.started' not in self.read():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit('worker did not start:\n' + self.read().decode()[-3000:])
            time.sleep(0.05)

    def read(self):
        with open(self.log.name, 'rb') as handle:
            return handle.read()

    def events(self, name):
        found = []
        for line in self.read().decode('utf-8', 'replace').splitlines():
            if ('"%s"' % name) in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
        return found

    def memory_kb(self):
        """(VmHWM, VmRSS) in kB: the peak and current resident set of the worker."""
        values = {}
        with open('/proc/%d/status' % self.pid) as handle:
            for line in handle:
                if line.startswith(('VmHWM:', 'VmRSS:')):
                    name, value = line.split(':', 1)
                    values[name] = int(value.split()[0])
        return values['VmHWM'], values['VmRSS']

    def cpu_s(self):
        """User + system CPU seconds of the worker so far, every thread."""
        with open('/proc/%d/stat' % self.pid) as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

    def threads(self):
        return len(os.listdir('/proc/%d/task' % self.pid))

    def terminate(self, timeout_s=60):
        """SIGTERM this worker (only it, by pid); returns (exit code, seconds to exit)."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, time.monotonic() - started

    def close(self):
        if self.process.poll() is None:
            self.terminate()
        self.log.close()


class Bench:
    def __init__(self, args):
        self.args = args
        ensure_database(args.database_url)
        self.prefix = 'aijob-conc-%s' % uuid.uuid4().hex[:8]
        self.base_env = {
            'AIJOB_DATABASE_URL': args.database_url,
            'AIJOB_REDIS_URL': args.redis_url,
            'AIJOB_REDIS_PREFIX': self.prefix,
            'AIJOB_INTERACTIVE_CONCURRENCY': str(args.jobs),
        }
        self.runtime = Runtime(load_config(dict(os.environ, **self.base_env)), role='conc')
        self.runtime.create_schema()
        with self.runtime.store.connection():
            for model in self.runtime.models:
                model.delete().execute()
        self.workers = []

    def worker(self, **settings):
        env = dict(os.environ, **self.base_env)
        env.update({k: str(v) for k, v in settings.items()})
        worker = WorkerProcess(env)
        self.workers.append(worker)
        return worker

    def close(self):
        for worker in self.workers:
            worker.close()
        self.runtime.close()
        client = redis.Redis.from_url(self.args.redis_url)
        keys = list(client.scan_iter(match=self.prefix + ':*', count=1000))
        if keys:
            client.delete(*keys)
        client.close()

    # -------------------------------------------------------------- helpers
    def create(self, count, job_input, tag):
        ids = [None] * count

        def creator(offset):
            with self.runtime.store.connection():
                for i in range(offset, count, CREATORS):
                    request = CreateJobInput(
                        user_id='conc-%s-%d' % (tag, i),
                        job_type='synthetic',
                        target_type='conc',
                        target_id=str(i),
                        input=dict(job_input),
                    )
                    ids[i] = self.runtime.service.create_job(request).job.id

        threads = [threading.Thread(target=creator, args=(n,)) for n in range(CREATORS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return ids

    def rows(self, ids):
        with self.runtime.store.connection():
            return list(AiJob.select().where(AiJob.id.in_(ids)))

    def wait(self, ids, done, timeout_s, interval_s=0.05, sample=None):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sample is not None:
                sample()
            rows = self.rows(ids)
            if done(rows):
                return rows
            time.sleep(interval_s)
        raise SystemExit('timed out after %.0fs' % timeout_s)

    def wait_terminal(self, ids, timeout_s):
        return self.wait(
            ids, lambda rows: all(r.lifecycle_status in TERMINAL for r in rows), timeout_s
        )

    def wait_running(self, ids, timeout_s=30):
        return self.wait(
            ids, lambda rows: all(r.lifecycle_status == 'running' for r in rows), timeout_s
        )

    # -------------------------------------------------------------- scenarios
    def throughput(self):
        n, sleep_ms = self.args.jobs, self.args.sleep_ms
        worker = self.worker()
        cpu_before, own_before = worker.cpu_s(), time.process_time()
        ids = self.create(n, {'sleepMs': sleep_ms}, 'tp')
        created_cpu = time.process_time() - own_before
        rows = self.wait_terminal(ids, timeout_s=60)
        worker_cpu = worker.cpu_s() - cpu_before
        hwm_kb, rss_kb = worker.memory_kb()
        threads = worker.threads()
        code, exit_s = worker.terminate()
        wall = (max(r.finished_at for r in rows) - min(r.created_at for r in rows)).total_seconds()
        succeeded = sum(r.lifecycle_status == 'succeeded' for r in rows)
        first_attempt = sum(r.attempt_no == 1 for r in rows)
        report(
            'throughput',
            jobs=n,
            sleep_ms=sleep_ms,
            wall_s=round(wall, 3),
            created_in_s=round(
                (max(r.created_at for r in rows) - min(r.created_at for r in rows)).total_seconds(),
                3,
            ),
            last_start_s=round(
                (max(r.started_at for r in rows) - min(r.created_at for r in rows)).total_seconds(),
                3,
            ),
            max_run_s=round(max((r.finished_at - r.started_at).total_seconds() for r in rows), 3),
            max_simultaneous=max_overlap(rows),
            worker_cpu_ms_per_job=round(worker_cpu * 1000.0 / n, 2),
            create_cpu_ms_per_job=round(created_cpu * 1000.0 / n, 2),
            peak_rss_mb=round(hwm_kb / 1024.0, 1),
            rss_mb=round(rss_kb / 1024.0, 1),
            worker_threads=threads,
            succeeded='%d/%d' % (succeeded, n),
            attempt_no_1='%d/%d' % (first_attempt, n),
            worker_exit=code,
            ok=wall < sleep_ms / 1000.0 + 1.5
            and hwm_kb < 200 * 1024
            and succeeded == n
            and first_attempt == n,
        )

    def heartbeat(self):
        n, sleep_ms = self.args.jobs, self.args.heartbeat_sleep_ms
        worker = self.worker(AIJOB_LOCK_TTL_MS=3000, AIJOB_HEARTBEAT_MS=1000)
        ids = self.create(n, {'sleepMs': sleep_ms}, 'hb')
        headroom = []

        def sample():
            with self.runtime.store.connection():
                now = self.runtime.store.clock()
                locks = [
                    r.lock_until
                    for r in AiJob.select(AiJob.lock_until).where(
                        AiJob.id.in_(ids) & (AiJob.lifecycle_status == 'running')
                    )
                ]
            if len(locks) == n:
                headroom.append(min((lock - now).total_seconds() for lock in locks))

        rows = self.wait(
            ids,
            lambda rows: all(r.lifecycle_status in TERMINAL for r in rows),
            timeout_s=60 + sleep_ms / 1000.0,
            interval_s=0.2,
            sample=sample,
        )
        code, _ = worker.terminate()
        succeeded = sum(r.lifecycle_status == 'succeeded' for r in rows)
        first_attempt = sum(r.attempt_no == 1 for r in rows)
        lost = len(worker.events('job.lock_lost'))
        report(
            'heartbeat',
            jobs=n,
            sleep_ms=sleep_ms,
            lock_ttl_ms=3000,
            heartbeat_ms=1000,
            samples_all_running=len(headroom),
            min_lock_headroom_ms=round(min(headroom) * 1000) if headroom else None,
            lock_lost_events=lost,
            succeeded='%d/%d' % (succeeded, n),
            attempt_no_1='%d/%d' % (first_attempt, n),
            worker_exit=code,
            ok=bool(headroom)
            and min(headroom) > 0
            and lost == 0
            and succeeded == n
            and first_attempt == n,
        )

    def cancel(self):
        n, sleep_ms = self.args.jobs, self.args.cancel_sleep_ms
        worker = self.worker()
        ids = self.create(n, {'sleepMs': sleep_ms}, 'cx')
        self.wait_running(ids)
        victims = ids[: n // 4]
        with self.runtime.store.connection():
            asked = self.runtime.store.clock()
            for job_id in victims:
                self.runtime.service.cancel_job(job_id)
        rows = self.wait_terminal(ids, timeout_s=60 + sleep_ms / 1000.0)
        code, _ = worker.terminate()
        by_id = {r.id: r for r in rows}
        cancelled = [by_id[j] for j in victims if by_id[j].lifecycle_status == 'cancelled']
        rest = [by_id[j] for j in ids[n // 4 :]]
        latest = (
            max((r.finished_at - asked).total_seconds() for r in cancelled) if cancelled else None
        )
        succeeded = sum(r.lifecycle_status == 'succeeded' for r in rest)
        report(
            'cancel',
            jobs=n,
            sleep_ms=sleep_ms,
            cancelled='%d/%d' % (len(cancelled), len(victims)),
            last_cancel_after_ms=round(latest * 1000) if latest is not None else None,
            others_succeeded='%d/%d' % (succeeded, len(rest)),
            worker_exit=code,
            ok=len(cancelled) == len(victims)
            and latest is not None
            and latest < 2.0
            and succeeded == len(rest),
        )

    def shutdown(self):
        n = self.args.jobs
        # Jobs that finish within the grace period: the worker waits for them, then exits 0.
        grace_ms = 10_000
        worker = self.worker(AIJOB_SHUTDOWN_GRACE_MS=grace_ms)
        ids = self.create(n, {'sleepMs': 3000}, 'sd1')
        self.wait_running(ids)
        code, exit_s = worker.terminate()
        rows = self.rows(ids)
        succeeded = sum(r.lifecycle_status == 'succeeded' for r in rows)
        report(
            'shutdown, jobs finish within the grace period',
            jobs=n,
            sleep_ms=3000,
            grace_ms=grace_ms,
            exit_code=code,
            exit_after_s=round(exit_s, 2),
            succeeded_before_exit='%d/%d' % (succeeded, n),
            ok=code == 0 and exit_s < grace_ms / 1000.0 and succeeded == n,
        )
        # Jobs that outlast it: handed back at the deadline, taken over by the next worker.
        grace_ms, sleep_ms = 2000, 8000
        worker = self.worker(AIJOB_SHUTDOWN_GRACE_MS=grace_ms)
        ids = self.create(n, {'sleepMs': sleep_ms}, 'sd2')
        self.wait_running(ids)
        code, exit_s = worker.terminate()
        left = self.rows(ids)
        running_left = sum(r.lifecycle_status == 'running' for r in left)
        successor = self.worker()
        rows = self.wait_terminal(ids, timeout_s=60 + sleep_ms / 1000.0)
        successor.terminate()
        succeeded = sum(r.lifecycle_status == 'succeeded' for r in rows)
        report(
            'shutdown, jobs outlast the grace period',
            jobs=n,
            sleep_ms=sleep_ms,
            grace_ms=grace_ms,
            exit_code=code,
            exit_after_s=round(exit_s, 2),
            handed_back=running_left,
            terminal_after_new_worker='%d/%d'
            % (sum(r.lifecycle_status in TERMINAL for r in rows), n),
            succeeded=succeeded,
            attempt_no_2=sum(r.attempt_no == 2 for r in rows),
            ok=code == 0 and exit_s < grace_ms / 1000.0 + 5.0 and succeeded == n,
        )


def max_overlap(rows):
    """The most jobs running at one instant, from their started_at/finished_at."""
    edges = sorted(
        [(r.started_at, 1) for r in rows if r.started_at]
        + [(r.finished_at, -1) for r in rows if r.finished_at],
        key=lambda edge: (edge[0], edge[1]),
    )
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


def report(name, **figures):
    print('%s: %s' % (name, ' '.join('%s=%s' % item for item in figures.items())), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--jobs', type=int, default=200)
    parser.add_argument('--sleep-ms', type=int, default=2000)
    parser.add_argument('--heartbeat-sleep-ms', type=int, default=6000)
    parser.add_argument('--cancel-sleep-ms', type=int, default=6000)
    parser.add_argument('--database-url', default=DATABASE_URL)
    parser.add_argument('--redis-url', default=REDIS_URL)
    parser.add_argument('--scenarios', nargs='+', choices=SCENARIOS, default=list(SCENARIOS))
    args = parser.parse_args(argv)
    bench = Bench(args)
    try:
        for name in args.scenarios:
            getattr(bench, name)()
    finally:
        bench.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
