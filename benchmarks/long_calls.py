"""Long calls beside the peers (issue 34, item 4): N jobs that each wait 10 s, all enqueued at
once, run by ONE worker process of aijob, dramatiq (gevent), Celery (``-P gevent``) and Huey
(``-k greenlet``), each with Redis as its broker, in one run on one machine.

Scenario ``sleep``: each job sleeps --sleep-ms. aijob runs as ``python aijob.py bench --jobs N
--concurrency N --sleep-ms S`` (MariaDB + Redis: every job durable); each peer runs N greenlets.
Scenario ``stream``: each job is one streamed chat completion from a loopback OpenAI-compatible
server (long_calls_server.py: asyncio, 100 chunks over --sleep-ms). aijob runs N
flashcard_generation jobs through ``python aijob.py worker`` with N interactive threads, and
forwards the text to each job's live-text stream (the streams feature's Redis channel): the
first delta's latency is the time from the server's first piece of text to the first entry in
that job's stream (Redis's own entry time), and every job's forwarded text is checked whole. The
peers read the same stream and forward nothing: wall time only.

Per system: wall time from the first enqueue to the last completion; create→running p50/p99
(aijob: the database's timestamps; peers: each job's enqueue and start times, one clock); the
worker process's peak RSS (VmHWM, summed over its process tree: dramatiq forks one worker) and
CPU (/proc, from when it was ready to the end; aijob's from the bench's count, start-up left
out). The machine is shared and noisy: compare figures of one run, and repeat (--rounds).

The peers run in a virtualenv of their own, made on first use from benchmarks/requirements.txt
(--peers-venv). Their Redis database (--peers-redis-url, default AIJOB_REDIS_URL) is FLUSHED
before each peer's run: give it one nobody else uses. It stops only the processes it started.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_long \\
    AIJOB_REDIS_URL=redis://127.0.0.1:6379/7 python benchmarks/long_calls.py --jobs 1000
"""

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, 'benchmarks')
sys.path.insert(0, ROOT)

import redis  # noqa: E402

from engine.core.models import AiJob  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
from engine.core.states import TERMINAL  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.features.streams.channel import TEXT as TEXT_ENTRY  # noqa: E402
from engine.features.streams.channel import open_text_channel  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

SYSTEMS = ('aijob', 'dramatiq', 'celery', 'huey')
DONE = 'long-calls:done'  # as long_calls_peers.py
FIRST = 'long-calls:first'
CREATORS = 4  # aijob's creating threads, as engine/bench.py
SAMPLE_S = 0.25
CHUNKS = 100  # as long_calls_server.py
PREFIX = 'long-calls-%d' % os.getpid()  # aijob's Redis keys in the stream scenario


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


# ---------------------------------------------------------------- a process tree, from /proc
def _tree(pid):
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        try:
            for task in os.listdir('/proc/%d/task' % current):
                with open('/proc/%d/task/%s/children' % (current, task)) as handle:
                    queue.extend(int(child) for child in handle.read().split())
        except OSError:
            pass
    return pids


def _cpu_s(pid):
    try:
        with open('/proc/%d/stat' % pid) as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _hwm_mb(pid):
    try:
        with open('/proc/%d/status' % pid) as handle:
            match = re.search(r'VmHWM:\s+(\d+) kB', handle.read())
    except OSError:
        return 0.0
    return int(match.group(1)) / 1024.0 if match else 0.0


class Watch:
    """Samples a process tree's CPU and peak RSS every SAMPLE_S until stopped: the last sample
    stands for the end (a process's counters vanish with it)."""

    def __init__(self, pid):
        self.pid = pid
        self.cpu_s = self.peak_mb = 0.0
        self.base_cpu_s = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self):
        pids = _tree(self.pid)
        self.cpu_s = max(self.cpu_s, sum(_cpu_s(p) for p in pids))
        self.peak_mb = max(self.peak_mb, sum(_hwm_mb(p) for p in pids))

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_S)

    def mark_ready(self):
        self._sample()
        self.base_cpu_s = self.cpu_s

    def stop(self):
        self._sample()
        self._stop.set()
        self._thread.join()
        return self.cpu_s - (self.base_cpu_s or 0.0), self.peak_mb


def stop_process(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# ---------------------------------------------------------------- aijob, scenario sleep
def aijob_sleep(args):
    """``python aijob.py bench``; its figures from its output, the worker's RSS from /proc."""
    argv = [sys.executable, 'aijob.py', 'bench', '--jobs', str(args.jobs)]
    argv += ['--concurrency', str(args.jobs), '--sleep-ms', str(args.sleep_ms)]
    bench = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watch, lines = None, []
    try:
        for line in bench.stdout:
            lines.append(line.rstrip())
            found = re.match(r'worker: process (\d+)', line)
            if found and watch is None:
                watch = Watch(int(found.group(1)))
        bench.wait()
    finally:
        stop_process(bench)
    _, peak_mb = watch.stop() if watch else (0.0, 0.0)
    out = dict(re.findall(r'^(\w+): (.*)$', '\n'.join(lines), re.M))
    if 'wall_s' not in out:
        raise SystemExit('long_calls: aijob bench failed:\n%s' % '\n'.join(lines[-30:]))
    return {
        'wall_s': float(out['wall_s']),
        'p50_s': float(out['p50']) / 1000,
        'p99_s': float(out['p99']) / 1000,
        'peak_mb': peak_mb,
        'cpu_s': float(out.get('worker_cpu_ms_per_job', 0)) * args.jobs / 1000,
        'ok': int(out['succeeded'].split('/')[0]),
    }


# ---------------------------------------------------------------- aijob, scenario stream
def aijob_stream(args, stream_url):
    """N flashcard jobs through ``aijob.py worker`` against the loopback server."""
    os.environ.update(
        AIJOB_PROVIDER_BASE_URL=stream_url + '/v1',
        AIJOB_PLATFORM_API_KEY='sk-long-calls-0000',
        AIJOB_INTERACTIVE_CONCURRENCY=str(args.jobs),
        AIJOB_REDIS_PREFIX=PREFIX,
        AIJOB_STREAM_TEXT_MAX_MESSAGES=str(4 * CHUNKS),
    )
    config = load_config()
    runtime = Runtime(config, role='long-calls')
    runtime.create_schema()
    log = tempfile.NamedTemporaryFile(prefix='aijob-long-calls-', suffix='.log', delete=False)
    worker = subprocess.Popen(
        [sys.executable, 'aijob.py', 'worker'], cwd=ROOT, stdout=log, stderr=log
    )
    try:
        watch = Watch(worker.pid)
        _wait_for(lambda: b'worker.started' in open(log.name, 'rb').read(), 60, worker)
        watch.mark_ready()
        ids = _create_flashcards(runtime, args.jobs)
        _wait_terminal(runtime, ids, 120 + args.sleep_ms / 1000 * 3)
        cpu_s, peak_mb = watch.stop()
    finally:
        stop_process(worker)
        log.close()
    figures = _db_figures(runtime, ids)
    figures.update(cpu_s=cpu_s, peak_mb=peak_mb)
    figures.update(_deltas(config, ids, stream_url))
    figures['errors_logged'] = _connection_errors(log.name)
    _drop_keys(config.redis_url, PREFIX)
    runtime.close()
    print('aijob worker log: %s' % log.name)
    return figures


def _wait_for(condition, timeout_s, process=None):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None and process.poll() is not None:
            raise SystemExit('long_calls: a process exited early (%s)' % process.args)
        if time.monotonic() > deadline:
            raise SystemExit('long_calls: timed out waiting (%s)' % getattr(process, 'args', ''))
        time.sleep(0.05)


def _create_flashcards(runtime, jobs):
    ids = [None] * jobs

    def creator(offset):
        with runtime.store.connection():
            for i in range(offset, jobs, CREATORS):
                request = CreateJobInput(
                    user_id='long-calls-%d' % i,
                    job_type='flashcard_generation',
                    target_type='bench',
                    target_id=str(i),
                    input={'text': 'Learn this: long-calls-job-%d.' % i, 'maxCards': 30},
                )
                ids[i] = runtime.service.create_job(request).job.id

    threads = [threading.Thread(target=creator, args=(n,)) for n in range(CREATORS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ids


def _wait_terminal(runtime, ids, timeout_s):
    pending = set(ids)
    deadline = time.monotonic() + timeout_s
    with runtime.store.connection():
        while pending and time.monotonic() < deadline:
            chunk = list(pending)[:500]
            query = AiJob.select(AiJob.id).where(
                AiJob.id.in_(chunk) & AiJob.lifecycle_status.in_(list(TERMINAL))
            )
            pending -= {row.id for row in query}
            time.sleep(0.1)
    if pending:
        print('long_calls: %d aijob jobs not finished in %.0f s' % (len(pending), timeout_s))


def _db_figures(runtime, ids):
    with runtime.store.connection():
        rows = list(
            AiJob.select(
                AiJob.lifecycle_status, AiJob.created_at, AiJob.started_at, AiJob.finished_at
            ).where(AiJob.id.in_(ids))
        )
    waits = [(r.started_at - r.created_at).total_seconds() for r in rows if r.started_at]
    ends = [r.finished_at for r in rows if r.finished_at]
    return {
        'wall_s': (max(ends) - min(r.created_at for r in rows)).total_seconds(),
        'p50_s': statistics.median(waits),
        'p99_s': percentile(waits, 99),
        'ok': sum(r.lifecycle_status == 'succeeded' for r in rows),
    }


def _deltas(config, ids, stream_url):
    """First-delta latency (ms) and the deltas forwarded, from each job's live-text stream."""
    with urllib.request.urlopen(stream_url + '/stats', timeout=30) as answer:
        stats = json.loads(answer.read())
    sent = stats['first_sent']
    sys.path.insert(0, HERE)
    from long_calls_server import TEXT  # noqa: PLC0415 (the benchmarks folder, not a package)

    channel = open_text_channel(config)
    firsts, deltas, whole = [], 0, 0
    for n, job_id in enumerate(ids):
        entries = [e for e in channel.read(job_id) if e.kind == TEXT_ENTRY]
        deltas += len(entries)
        whole += ''.join(e.text for e in entries) == TEXT
        marker = 'long-calls-job-%d' % n
        if entries and marker in sent:
            firsts.append(int(entries[0].id.split('-')[0]) - sent[marker] * 1000)
    channel.close()
    return {
        'first_delta_p50_ms': statistics.median(firsts) if firsts else None,
        'first_delta_p99_ms': percentile(firsts, 99) if firsts else None,
        'deltas': deltas,
        'whole_text': whole,
        'server_most_streams': stats['most_streams'],
    }


def _connection_errors(path):
    with open(path, encoding='utf-8', errors='replace') as handle:
        return sum('ConnectionError' in line or 'MaxConnections' in line for line in handle)


def _drop_keys(url, prefix):
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=prefix + ':*', count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


# ---------------------------------------------------------------- the peers
def peers_python(venv):
    """The peers' virtualenv's python, made from requirements.txt on first use."""
    python = os.path.join(venv, 'bin', 'python')
    if not os.path.exists(os.path.join(venv, '.long-calls-ok')):
        subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
        requirements = os.path.join(HERE, 'requirements.txt')
        subprocess.run([python, '-m', 'pip', 'install', '-q', '-r', requirements], check=True)
        open(os.path.join(venv, '.long-calls-ok'), 'w').close()
    return python


def peer_worker_argv(python, peer):
    """The worker command; its concurrency comes from _concurrency_args."""
    bin_dir = os.path.dirname(python)
    if peer == 'dramatiq':
        return [os.path.join(bin_dir, 'dramatiq-gevent'), 'long_calls_peers']
    if peer == 'celery':
        return [python, '-m', 'celery', '-A', 'long_calls_peers', 'worker', '-P', 'gevent']
    # Huey's greenlet workers leave the patching to the program (its consumer warns): patched
    # first, as its documentation's own entry point would.
    main = 'from gevent import monkey; monkey.patch_all()\n'
    main += 'from huey.bin.huey_consumer import consumer_main; consumer_main()'
    return [python, '-c', main, 'long_calls_peers.huey', '-k', 'greenlet']


def _concurrency_args(peer, jobs):
    if peer == 'dramatiq':
        return ['--processes', '1', '--threads', str(jobs)]
    if peer == 'celery':
        return ['-c', str(jobs), '--loglevel', 'WARNING', '--without-heartbeat']
    # Huey's idle greenlets back off up to -m seconds between polls: 1 s at most here.
    return ['-w', str(jobs), '-d', '0.05', '-m', '1']


def run_peer(args, python, peer, stream_url):
    client = redis.Redis.from_url(args.peers_redis_url)
    client.flushdb()
    env = dict(
        os.environ,
        PYTHONPATH=HERE,
        LONG_CALLS_PEER=peer,
        LONG_CALLS_REDIS_URL=args.peers_redis_url,
        LONG_CALLS_STREAM_URL=stream_url or '',
        LONG_CALLS_CONNECTIONS=str(args.jobs + 16),
    )
    log = tempfile.NamedTemporaryFile(prefix='long-calls-%s-' % peer, suffix='.log', delete=False)
    argv = peer_worker_argv(python, peer) + _concurrency_args(peer, args.jobs)
    worker = subprocess.Popen(argv, cwd=HERE, env=env, stdout=log, stderr=log)
    sleep_s = args.sleep_ms / 1000.0
    try:
        watch = Watch(worker.pid)
        # Ready when it has run a first job (the greenlets spawned, the broker connected).
        enqueue = 'import long_calls_peers as p\np.send(0, 0, "warm-up")'
        subprocess.run([python, '-c', enqueue], cwd=HERE, env=env, check=True)
        _wait_for(lambda: client.llen(DONE) >= 1, 120, worker)
        client.delete(DONE)
        watch.mark_ready()
        enqueue = 'import long_calls_peers as p\np.enqueue(%d, %r)' % (args.jobs, sleep_s)
        subprocess.run([python, '-c', enqueue], cwd=HERE, env=env, check=True)
        timeout_s = 120 + sleep_s * 10
        try:
            _wait_for(lambda: client.llen(DONE) >= args.jobs, timeout_s, worker)
        except SystemExit as exc:
            print('long_calls: %s: %s (%d done)' % (peer, exc, client.llen(DONE)))
        cpu_s, peak_mb = watch.stop()
    finally:
        stop_process(worker)
        log.close()
    rows = [tuple(map(float, item.split())) for item in client.lrange(DONE, 0, -1)]
    first = float(client.get(FIRST))
    client.flushdb()
    waits = [started - enqueued for enqueued, started, _ in rows]
    return {
        'wall_s': max(done for _, _, done in rows) - first if rows else None,
        'p50_s': statistics.median(waits) if waits else None,
        'p99_s': percentile(waits, 99) if waits else None,
        'peak_mb': peak_mb,
        'cpu_s': cpu_s,
        'ok': len(rows),
        'errors_logged': _connection_errors(log.name),
    }


# ---------------------------------------------------------------- the run
def start_stream_server(seconds):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, 'long_calls_server.py'), '--port', str(port)]
        + ['--seconds', str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    server.stdout.readline()  # "listening on …"
    return server, 'http://127.0.0.1:%d' % port


def run_scenario(args, scenario, python):
    server, url = (None, None)
    if scenario == 'stream':
        server, url = start_stream_server(args.sleep_ms / 1000.0)
    results = {}
    try:
        for system in args.systems.split(','):
            print('%s: %s, %d jobs ...' % (scenario, system, args.jobs), flush=True)
            if system == 'aijob':
                run = aijob_stream(args, url) if scenario == 'stream' else aijob_sleep(args)
            else:
                run = run_peer(args, python, system, url)
            print('  %s' % json.dumps(run), flush=True)
            results[system] = run
    finally:
        if server is not None:
            stop_process(server)
    return results


def fmt(value, pattern):
    return '—' if value is None else pattern % value


def print_table(scenario, jobs, rounds):
    """Medians over the rounds, per system."""
    print('\n%s, N = %d (medians of %d rounds)' % (scenario, jobs, len(rounds)))
    head = '| system | wall s | create→running p50 / p99 s | peak RSS MB | worker CPU s | done |'
    if scenario == 'stream':
        head += ' first delta p50 / p99 ms | deltas | whole texts |'
    print(head)
    print('|' + '---|' * (head.count('|') - 1))
    for system in rounds[0]:
        runs = [r[system] for r in rounds]

        def med(name, runs=runs):
            values = [r.get(name) for r in runs if r.get(name) is not None]
            return statistics.median(values) if values else None

        row = '| %s | %s | %s / %s | %s | %s | %s/%d |' % (
            system,
            fmt(med('wall_s'), '%.1f'),
            fmt(med('p50_s'), '%.2f'),
            fmt(med('p99_s'), '%.2f'),
            fmt(med('peak_mb'), '%.0f'),
            fmt(med('cpu_s'), '%.1f'),
            fmt(med('ok'), '%d'),
            jobs,
        )
        if scenario == 'stream':
            row += ' %s / %s | %s | %s |' % (
                fmt(med('first_delta_p50_ms'), '%.0f'),
                fmt(med('first_delta_p99_ms'), '%.0f'),
                fmt(med('deltas'), '%d'),
                fmt(med('whole_text'), '%d'),
            )
        print(row)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--jobs', type=int, default=1000)
    parser.add_argument('--sleep-ms', type=int, default=10_000)
    parser.add_argument('--systems', default=','.join(SYSTEMS))
    parser.add_argument('--scenarios', default='sleep,stream')
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--peers-venv', default=os.path.join(tempfile.gettempdir(), 'long-calls'))
    parser.add_argument('--peers-redis-url', default=os.environ.get('AIJOB_REDIS_URL'))
    args = parser.parse_args(argv)
    config = load_config()
    mysql = config.database_url.startswith(('mysql:', 'mariadb:'))
    if not mysql or not config.uses_redis or not args.peers_redis_url:
        raise SystemExit('long_calls: set AIJOB_DATABASE_URL=mysql://… and AIJOB_REDIS_URL')
    peers = [s for s in args.systems.split(',') if s != 'aijob']
    python = peers_python(args.peers_venv) if peers else None
    for scenario in args.scenarios.split(','):
        rounds = [run_scenario(args, scenario, python) for _ in range(args.rounds)]
        print_table(scenario, args.jobs, rounds)
    return 0


if __name__ == '__main__':
    sys.exit(main())
