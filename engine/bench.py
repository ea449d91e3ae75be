"""``python aijob.py bench --jobs N``: end-to-end throughput and latency on the configured
backends, measured honestly: N synthetic jobs created through AiJobService, run by one worker
process, timed from the first create to the last terminal state.

Latencies come from the database's own timestamps (created_at → started_at, one clock). Commits
and statements are counted by each process's store (``Store.commit_count`` and
``Store.statement_count``: every statement sent, BEGIN/COMMIT/ROLLBACK included) and summed. CPU
is user + system time of every aijob process in the run: this one (the creating threads, and
the worker too when it runs in-process) from the first create to the last terminal state, and
the worker process's from ready to stop (it reports its total in its ``worker.stopped`` log line;
its start-up, read from /proc when it is ready, is left out). The bench's own polling for the
end (its statements, its thread's CPU) is left out. The database server's CPU is not in
``cpu_ms_per_job``; for a local MariaDB/MySQL it is printed apart as ``db_cpu_ms_per_job`` (read
from /proc for the whole server: other clients' load, and the bench's polls, count too).

``--concurrency C`` runs C ai-interactive worker threads (AIJOB_INTERACTIVE_CONCURRENCY),
``--sleep-ms S`` makes every job sleep S ms (input ``{"sleepMs": S}``): the I/O-bound case.
``--users N`` spreads the jobs over N users (job i is user i mod N; default: every job its own
user), the per-user admission limits lifted for the run: what the queues' fair turns cost with
one user, with a few, with many.

``--gateway`` turns on every guard of the gateway (docs/architecture.md, decision 17) around the
synthetic call: a price for it, a global daily budget it never reaches (each call reserves and
settles), a rate limit it never reaches (each call reserves a slot and settles its tokens) and
the response cache (job type ``synthetic_cached``; every job is another user's, so every call
misses: it claims its key and writes its entry). What the guards cost, and nothing else.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from .core.config import Config
from .core.models import AiJob
from .core.service import CreateJobInput
from .core.states import TERMINAL
from .extensions import load_config
from .runtime import Runtime

CREATORS = 4  # client threads creating jobs, as several web requests would
POLL_CHUNK = 200  # jobs one poll for the end reads at most
DB_SERVER_NAMES = ('mariadbd', 'mysqld')


# The settings ``--gateway`` adds, in the environment so that the worker process has them too.
GATEWAY_SETTINGS = {
    'AIJOB_DEFINITIONS': 'engine.jobtypes.synthetic_cached',
    # The synthetic provider priced and limited (limits never reached) through the provider
    # config, the one place prices and limits are said: every guard runs around each call.
    'AIJOB_PROVIDERS': json.dumps(
        {
            'providers': {
                'synthetic': {
                    'models': {
                        'synthetic-1': {
                            'price': {'prompt': '0.27', 'completion': '1.10'},
                            'limits': {'rpm': 1_000_000_000, 'tpm': 1_000_000_000_000},
                        }
                    }
                }
            }
        }
    ),
}
GATEWAY_BUDGET = ('global', '', 'day', '99999999', 'fail')  # never reached


def gateway_config(environ):
    """The Config of ``--gateway``: the environment plus GATEWAY_SETTINGS, which are also put
    in ``environ`` for the worker process the bench starts."""
    environ.update(GATEWAY_SETTINGS)
    return load_config(environ)


def run_bench(config, jobs, rate=0, concurrency=None, sleep_ms=0, gateway=False, users=0):
    """``rate`` > 0 paces creation at that many jobs per second (latency below saturation);
    0 creates them all at once (throughput, where create→running is mostly queueing).
    ``concurrency`` (default: the configured AIJOB_INTERACTIVE_CONCURRENCY) is the worker's
    ai-interactive thread count; ``sleep_ms`` > 0 makes each job sleep that long; ``users`` > 0
    spreads the jobs over that many users (their admission limits lifted)."""
    if concurrency:
        config = Config(dict(vars(config), interactive_concurrency=int(concurrency)))
    if users:
        config = Config(dict(vars(config), max_active_jobs_per_user=0, daily_job_quota=0))
    runtime = Runtime(config, role='bench')
    runtime.create_schema()
    job_type = 'synthetic'
    if gateway:
        with runtime.store.connection():
            runtime.features['budgets'].put(*GATEWAY_BUDGET)
        job_type = 'synthetic_cached'
    _exit_on_sigterm()
    worker = _start_worker(runtime)
    db_cpu = _DatabaseCpu(runtime)
    try:
        commits_before = runtime.store.commit_count()
        statements_before = runtime.store.statement_count()
        round_trips_before = runtime.store.round_trip_count()
        cpu_before = time.process_time()
        db_cpu.start()
        ids = _create(runtime, jobs, rate, sleep_ms, job_type, users)
        timeout_s = max(60.0, jobs * 0.2) + 1.5 * jobs * sleep_ms / 1000.0 / max(
            1, config.interactive_concurrency
        )
        polls, poll_cpu_ms = _wait_terminal(runtime, ids, timeout_s=timeout_s)
        db_cpu_ms = db_cpu.stop()
        own = {
            'commits': runtime.store.commit_count() - commits_before,
            # the polls for the end are the bench's own, not the engine's
            'statements': runtime.store.statement_count() - statements_before - polls,
            'round_trips': runtime.store.round_trip_count() - round_trips_before - polls,
            'cpu_ms': (time.process_time() - cpu_before) * 1000.0 - poll_cpu_ms,
        }
    finally:
        worker_counts = worker.stop()
    totals = {name: own[name] + worker_counts[name] for name in own}
    figures = _figures(runtime, ids, totals, rate, sleep_ms)
    figures['users'] = users or jobs
    if isinstance(worker, _WorkerProcess):
        figures['bench_cpu_ms_per_job'] = round(own['cpu_ms'] / len(ids), 3)
        figures['worker_cpu_ms_per_job'] = round(worker_counts['cpu_ms'] / len(ids), 3)
        figures['bench_statements_per_job'] = round(own['statements'] / len(ids), 2)
        figures['worker_statements_per_job'] = round(worker_counts['statements'] / len(ids), 2)
        figures['bench_round_trips_per_job'] = round(own['round_trips'] / len(ids), 2)
        figures['worker_round_trips_per_job'] = round(worker_counts['round_trips'] / len(ids), 2)
    creates = runtime.service.creates
    if creates.groups:  # how many creates shared a commit, on average
        figures['creates_per_commit'] = round(creates.works / creates.groups, 2)
    for name, value in figures.items():
        print('%s: %s' % (name, value))
    if db_cpu_ms is not None:
        print('db_cpu_ms_per_job=%.2f' % (db_cpu_ms / len(ids)))
    print(
        'e2e_jobs_per_s=%(e2e_jobs_per_s).1f create_to_running_p50_ms=%(p50).2f '
        'create_to_running_p99_ms=%(p99).2f commits_per_job=%(commits_per_job).2f '
        'statements_per_job=%(statements_per_job).2f round_trips_per_job=%(round_trips_per_job).2f '
        'cpu_ms_per_job=%(cpu_ms_per_job).2f '
        'succeeded=%(succeeded)d/%(jobs)d' % figures
    )
    runtime.close()
    return 0 if figures['succeeded'] == jobs else 1


def _create(runtime, jobs, rate, sleep_ms, job_type='synthetic', users=0):
    """``jobs`` jobs from CREATORS threads; a bench told to stop (an exception in this thread,
    such as _exit_on_sigterm's) stops them first, so none creates on without the bench."""
    ids = [None] * jobs
    started = time.monotonic()
    job_input = {'sleepMs': int(sleep_ms)} if sleep_ms else {}
    stop = threading.Event()

    def creator(offset):
        with runtime.store.connection():
            for i in range(offset, jobs, CREATORS):
                if rate:
                    delay = started + i / rate - time.monotonic()
                    if delay > 0 and stop.wait(delay):
                        return
                if stop.is_set():
                    return
                request = CreateJobInput(
                    user_id='bench-%d' % (i % users if users else i),
                    job_type=job_type,
                    target_type='bench',
                    target_id=str(i),
                    input=dict(job_input),
                )
                ids[i] = runtime.service.create_job(request).job.id

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(CREATORS)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        stop.set()
        for thread in threads:
            thread.join()
        raise
    return ids


def _wait_terminal(runtime, ids, timeout_s):
    """Wait until every job is terminal. Returns how many polls it took (one statement each)
    and the CPU this thread spent polling, both the bench's own and not the engine's. A poll
    reads at most POLL_CHUNK of the jobs not yet seen terminal, oldest first, so that its cost
    (here and in the database) stays small and does not grow with the run."""
    deadline = time.monotonic() + timeout_s
    cpu_before = time.thread_time()
    pending = list(ids)
    polls = 0
    with runtime.store.connection():
        while time.monotonic() < deadline:
            polls += 1
            chunk, rest = pending[:POLL_CHUNK], pending[POLL_CHUNK:]
            done = {
                row.id
                for row in AiJob.select(AiJob.id).where(
                    AiJob.id.in_(chunk) & AiJob.lifecycle_status.in_(list(TERMINAL))
                )
            }
            pending = [job_id for job_id in chunk if job_id not in done] + rest
            if not pending:
                return polls, (time.thread_time() - cpu_before) * 1000.0
            if len(done) < len(chunk):
                time.sleep(0.05)
    raise SystemExit('bench: not every job finished within %.0fs' % timeout_s)


def _figures(runtime, ids, totals, rate, sleep_ms):
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
        'job_input': {'sleepMs': int(sleep_ms)} if sleep_ms else {},
        'interactive_concurrency': runtime.config.interactive_concurrency,
        'jobs': len(ids),
        'wall_s': round(wall_s, 3),
        'e2e_jobs_per_s': len(ids) / wall_s if wall_s else float('inf'),
        'p50': statistics.median(waits),
        'p99': waits[min(len(waits) - 1, int(len(waits) * 0.99))],
        'commits_per_job': totals['commits'] / len(ids),
        'statements_per_job': totals['statements'] / len(ids),
        'round_trips_per_job': totals['round_trips'] / len(ids),
        'cpu_ms_per_job': totals['cpu_ms'] / len(ids),
        'succeeded': sum(r.lifecycle_status == 'succeeded' for r in rows),
    }


# ---------------------------------------------------------------- CPU from /proc
def _proc_cpu_ms(pid):
    """User + system CPU of process ``pid`` (every thread) from /proc, or None if unreadable."""
    try:
        with open('/proc/%d/stat' % pid, 'rb') as handle:
            stat = handle.read().decode('ascii', 'replace')
    except OSError:
        return None
    fields = stat[stat.rindex(')') + 2 :].split()  # after "pid (comm) "; fields 3.. of proc(5)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1000.0 / os.sysconf('SC_CLK_TCK')


class _DatabaseCpu:
    """The CPU of a local MariaDB/MySQL server over the run, from /proc; None when the store is
    SQLite (in-process: already counted), the server is remote, or no server process is found."""

    def __init__(self, runtime):
        self.pids = []
        self.before = None
        if runtime.store.dialect != 'mysql':
            return
        host = urlsplit(runtime.config.database_url).hostname or '127.0.0.1'
        if host not in ('127.0.0.1', 'localhost', '::1'):
            return
        for name in DB_SERVER_NAMES:
            try:
                found = subprocess.run(
                    ['pgrep', '-x', name], capture_output=True, text=True, timeout=5
                ).stdout.split()
            except (OSError, subprocess.SubprocessError):
                return
            if found:
                self.pids = [int(pid) for pid in found]
                return

    def _now(self):
        values = [_proc_cpu_ms(pid) for pid in self.pids]
        return None if not values or None in values else sum(values)

    def start(self):
        self.before = self._now()

    def stop(self):
        after = self._now()
        if self.before is None or after is None:
            return None
        return after - self.before


# ---------------------------------------------------------------- the worker
def _exit_on_sigterm():
    """A bench told to stop (SIGTERM) exits through its ``finally``, which stops its worker
    process: killed outright, it would leave the worker running, and that worker would take a
    share of the next bench's jobs on the same backends. Only the main thread may set it."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _start_worker(runtime):
    if runtime.config.uses_redis:
        return _WorkerProcess(runtime)
    return _InProcessWorker(runtime)


_NOTHING = {'commits': 0, 'statements': 0, 'round_trips': 0, 'cpu_ms': 0.0}


class _InProcessWorker:
    """SQLite + in-memory queue cannot cross processes: the worker runs in this one, so this
    process's counters and CPU already include it."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.description = 'in-process (in-memory queue), %d interactive threads' % (
            runtime.config.interactive_concurrency
        )
        print('worker: %s' % self.description)
        runtime.start_background()

    def stop(self):
        self.runtime.stop_background(timeout_s=10)
        return dict(_NOTHING)


class _WorkerProcess:
    """``python aijob.py worker`` as a child; its commits, statements and CPU come from its
    ``worker.stopped`` log line (CPU less what it had used when it became ready)."""

    def __init__(self, runtime):
        self.log = tempfile.NamedTemporaryFile(
            prefix='aijob-bench-worker-', suffix='.log', delete=False
        )
        entry = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'aijob.py'
        )
        env = dict(os.environ)
        env['AIJOB_INTERACTIVE_CONCURRENCY'] = str(runtime.config.interactive_concurrency)
        self.process = subprocess.Popen(
            [sys.executable, entry, 'worker'], stdout=self.log, stderr=self.log, env=env
        )
        self.description = 'process %d, %d interactive threads' % (
            self.process.pid,
            runtime.config.interactive_concurrency,
        )
        print('worker: %s' % self.description, flush=True)
        try:
            self._wait_ready()
        except BaseException:  # told to stop while it starts: it must not outlive the bench
            self.process.kill()
            self.process.wait(10)
            raise
        self.startup_cpu_ms = _proc_cpu_ms(self.process.pid) or 0.0
        self.stopped = None

    def _wait_ready(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit('bench: the worker exited at start; see %s' % self.log.name)
            if b'worker.started' in open(self.log.name, 'rb').read():
                return
            time.sleep(0.05)
        raise SystemExit('bench: the worker did not start; see %s' % self.log.name)

    def stop(self):
        if self.stopped is not None:
            return self.stopped
        self.process.terminate()
        self.process.wait(60)
        for line in open(self.log.name, encoding='utf-8', errors='replace'):
            if '"worker.stopped"' in line:
                record = json.loads(line)
                missing = [
                    name for name in ('statements', 'round_trips', 'cpu_ms') if name not in record
                ]
                if missing:
                    raise SystemExit(
                        'bench: the worker reported no %s; see %s'
                        % (', '.join(missing), self.log.name)
                    )
                self.stopped = {
                    'commits': record.get('commits', 0),
                    'statements': record['statements'],
                    'round_trips': record['round_trips'],
                    'cpu_ms': max(0.0, float(record['cpu_ms']) - self.startup_cpu_ms),
                }
                os.unlink(self.log.name)
                return self.stopped
        raise SystemExit('bench: no counts from the worker; see %s' % self.log.name)
