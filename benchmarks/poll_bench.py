"""Status GET against its floor (issue 9, item 5; issue 23).

On the configured MySQL/MariaDB + Redis (AIJOB_DATABASE_URL, AIJOB_REDIS_URL) it creates a token
and one finished synthetic job, starts ``python aijob.py web --workers 4`` and the bare floor app
(``benchmarks/poll_floor.py``, same gunicorn settings, one primary-key read) on free ports, warms
each up with the same load (not measured: pools grow, each worker serves its first requests),
then drives each in turn with ``wrk -t2 -c16 -d5s`` when ``wrk`` is installed, else with a
Python client of 16 keep-alive http.client connections (threads, spread over two processes so
one GIL does not cap it), in ``--rounds`` alternating rounds with both servers up. Each round
prints the requests/s and, with wrk, the p99 of both and their ratios, and (on Linux) how long
the servers' workers waited for a CPU in the run queue beside the CPU they used
(/proc/<pid>/schedstat: a wait far above the CPU time means the machine, not the app, made the
tail) and how wrk's connections landed on the workers (whichever worker wakes first accepts:
16/0/0/0 has another tail than 4/4/4/4). Last come the medians: ``status_get_rps=…
floor_rps=… status_get_vs_floor=…`` and ``status_get_p99_ms=… floor_p99_ms=…
status_get_p99_vs_floor=…`` (ratios are medians of the per-round ratios). With ``--profile``
and py-spy on PATH, the last round also samples one worker of each server and prints its
functions by own time. It stops only the processes it started, by pid.

``--floors gevent,sync`` adds the floor served by gunicorn's sync workers (poll_floor.py
``--sync``: one request per process at a time, no keep-alive), the floor issue 34 holds the
p99 against; ``--variants web,reuse_port,…`` serves the status GET from several ``web``s at
once, each with one suspect of the tail changed (benchmarks/poll_variant.py), every pair of a
status GET and a floor compared per round.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_bench \\
    AIJOB_REDIS_URL=redis://127.0.0.1:6379/3 python benchmarks/poll_bench.py
"""

import argparse
import http.client
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.core.models import AiJob  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
from engine.core.states import TERMINAL  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.http.auth import TokenStore  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

USER = 'poll-bench'


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def prepare(config):
    """A token for USER and one succeeded job of USER's; returns (token, job id)."""
    runtime = Runtime(config, role='poll-bench')
    try:
        runtime.create_schema()
        with runtime.store.connection():
            token = TokenStore(runtime.store).create(USER)
        runtime.start_background(with_maintenance=False)
        with runtime.store.connection():
            request = CreateJobInput(
                user_id=USER, job_type='synthetic', target_type='bench', target_id='poll', input={}
            )
            job_id = runtime.service.create_job(request).job.id
            deadline = time.monotonic() + 30
            while AiJob.get_by_id(job_id).lifecycle_status not in TERMINAL:
                if time.monotonic() > deadline:
                    raise SystemExit('poll_bench: the job did not finish')
                time.sleep(0.05)
            status = AiJob.get_by_id(job_id).lifecycle_status
    finally:
        runtime.close()
    print('job %s: %s' % (job_id, status))
    return token, job_id


class Server:
    """A process this script started; stopped by its pid (SIGTERM, then SIGKILL)."""

    def __init__(self, name, argv, port):
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile(prefix='aijob-poll-%s-' % name, suffix='.log')
        self.process = subprocess.Popen(
            argv, stdout=self.log, stderr=self.log, cwd=ROOT, start_new_session=True
        )
        print('%s: pid %d on port %d' % (name, self.process.pid, port))

    def wait_ready(self, path, headers, timeout_s=120):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit('poll_bench: %s exited; log %s' % (self.name, self._tail()))
            try:
                conn = http.client.HTTPConnection('127.0.0.1', self.port, timeout=2)
                conn.request('GET', path, headers=headers)
                response = conn.getresponse()
                body = response.read()
                conn.close()
                if response.status == 200:
                    return
                raise SystemExit(
                    'poll_bench: %s answered %d: %r' % (self.name, response.status, body[:200])
                )
            except OSError:
                time.sleep(0.1)
        raise SystemExit('poll_bench: %s did not start; log %s' % (self.name, self._tail()))

    def worker_pids(self):
        """The gunicorn workers' pids (the master's children), or [] where /proc has none."""
        try:
            with open('/proc/%d/task/%d/children' % ((self.process.pid,) * 2)) as handle:
                return [int(pid) for pid in handle.read().split()]
        except OSError:
            return []

    def error_lines(self, most=5):
        """The first lines of its log that are not a 200's access line nor gunicorn's own."""
        self.log.flush()
        with open(self.log.name, encoding='utf-8', errors='replace') as handle:
            lines = [
                line.strip()
                for line in handle
                if '"status": 200' not in line and 'gunicorn.error' not in line
            ]
        return '\n'.join(lines[:most])

    def _tail(self):
        self.log.flush()
        with open(self.log.name, encoding='utf-8', errors='replace') as handle:
            return handle.read()[-2000:]

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the gunicorn master stops its workers
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


# ---------------------------------------------------------------- load generators
def run_wrk(port, path, headers, connections, duration_s, threads=2):
    argv = ['wrk', '-t%d' % threads, '-c%d' % connections, '-d%ds' % duration_s, '--latency']
    for name, value in headers.items():
        argv += ['-H', '%s: %s' % (name, value)]
    out = subprocess.run(
        argv + ['http://127.0.0.1:%d%s' % (port, path)], capture_output=True, text=True
    ).stdout
    match = re.search(r'Requests/sec:\s*([\d.]+)', out)
    if not match:
        raise SystemExit('poll_bench: no figure from wrk:\n%s' % out)
    errors = re.search(r'Non-2xx or 3xx responses:\s*(\d+)', out)
    if errors:
        print('poll_bench: wrk saw non-2xx answers:\n%s' % out)
    p50 = wrk_p99_ms(out, 50)
    print('  wrk p50 %s ms, p90 %s ms' % (p50, wrk_p99_ms(out, 90)))
    return float(match.group(1)), int(errors.group(1)) if errors else 0, wrk_p99_ms(out)


WRK_UNITS_MS = {'us': 0.001, 'ms': 1.0, 's': 1000.0, 'm': 60_000.0}


def wrk_p99_ms(out, percent=99):
    """A percentile of wrk's ``--latency`` distribution (50, 75, 90 or 99), in ms, or None."""
    match = re.search(r'^\s*%d%%\s+([\d.]+)(us|ms|s|m)\s*$' % percent, out, re.M)
    return float(match.group(1)) * WRK_UNITS_MS[match.group(2)] if match else None


def _client_process(port, path, headers, threads, warmup_s, duration_s, results):
    counts, errors = [0] * threads, [0] * threads
    start_at = time.monotonic() + warmup_s
    stop_at = start_at + duration_s

    def client(n):
        conn = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            try:
                conn.request('GET', path, headers=headers)
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
                if response.will_close:
                    conn.close()
            except (OSError, http.client.HTTPException):
                conn.close()
                ok = False
            if now >= start_at:
                if ok:
                    counts[n] += 1
                else:
                    errors[n] += 1
        conn.close()

    workers = [threading.Thread(target=client, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put((sum(counts), sum(errors)))


def run_python_client(port, path, headers, connections, duration_s, processes=2, warmup_s=1.0):
    context = multiprocessing.get_context('fork')
    results = context.Queue()
    per_process = [
        connections // processes + (i < connections % processes) for i in range(processes)
    ]
    children = [
        context.Process(
            target=_client_process,
            args=(port, path, headers, threads, warmup_s, duration_s, results),
        )
        for threads in per_process
        if threads
    ]
    for child in children:
        child.start()
    totals = [results.get(timeout=duration_s + warmup_s + 60) for _ in children]
    for child in children:
        child.join()
    return sum(t[0] for t in totals) / duration_s, sum(t[1] for t in totals)


# ---------------------------------------------------------------- what the machine did
def cpu_and_wait_s(pids):
    """(CPU time, time runnable but waiting for a CPU) summed over ``pids``, in seconds, from
    /proc/<pid>/schedstat (Linux), or None."""
    cpu = wait = 0
    try:
        for pid in pids:
            with open('/proc/%d/schedstat' % pid) as handle:
                ran, waited = handle.read().split()[:2]
            cpu, wait = cpu + int(ran), wait + int(waited)
    except (OSError, ValueError):
        return None
    return cpu / 1e9, wait / 1e9


def connections_per_worker(port, pids):
    """How many established connections to ``port`` each worker holds (Linux /proc), sorted,
    or None. wrk opens its connections at once and whichever worker wakes first accepts them:
    a round with 13 of 16 on one worker has another tail than one with 4 on each."""
    try:
        inodes = set()
        for table in ('/proc/net/tcp', '/proc/net/tcp6'):
            with open(table) as handle:
                for row in handle.readlines()[1:]:
                    fields = row.split()
                    if fields[3] == '01' and int(fields[1].rsplit(':', 1)[1], 16) == port:
                        inodes.add('socket:[%s]' % fields[9])
        counts = []
        for pid in pids:
            fds = '/proc/%d/fd' % pid
            counts.append(sum(_readlink(os.path.join(fds, fd)) in inodes for fd in os.listdir(fds)))
    except OSError:
        return None
    return sorted(counts, reverse=True)


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def start_profile(pid, duration_s, out_path):
    """py-spy sampling one worker while wrk runs (a measuring tool, not a dependency)."""
    argv = ['py-spy', 'record', '--pid', str(pid), '--duration', str(max(1, duration_s - 1))]
    argv += ['--rate', '200', '--format', 'raw', '--nonblocking', '-o', out_path]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def own_time(raw_path, top=15):
    """[(share of samples, function)] by own time, from py-spy's raw (collapsed) stacks."""
    counts, total = {}, 0
    with open(raw_path, encoding='utf-8', errors='replace') as handle:
        for line in handle:
            stack, _, n = line.rstrip().rpartition(' ')
            leaf = re.sub(r':\d+\)$', ')', stack.split(';')[-1])
            counts[leaf] = counts.get(leaf, 0) + int(n)
            total += int(n)
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:top]
    return [(n / total, name) for name, n in ranked]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workers', type=int, default=4, help='gunicorn workers of both apps')
    parser.add_argument('--connections', type=int, default=16)
    parser.add_argument('--threads', type=int, default=2, help="wrk's threads (-t)")
    parser.add_argument('--duration', type=int, default=5, help='seconds per target')
    parser.add_argument('--warmup', type=int, default=2, help='unmeasured seconds per target')
    parser.add_argument('--rounds', type=int, default=5, help='alternating rounds')
    parser.add_argument('--python-client', action='store_true', help='even if wrk is installed')
    parser.add_argument('--profile', action='store_true', help='py-spy in the last round')
    parser.add_argument(
        '--variants',
        default='web',
        help='status GET servers, comma-separated: web (as it ships) or poll_variant.py names',
    )
    parser.add_argument(
        '--floors', default='gevent', help="the floor's gunicorn worker classes: gevent,sync"
    )
    return parser.parse_args(argv)


def targets_for(args, token, job_id):
    """[(name, server argv, path, headers)]: the status GET (``web`` as it ships, or each of
    ``--variants``, benchmarks/poll_variant.py) and each of ``--floors``."""
    status = ('/api/ai/jobs/%s' % job_id, {'Authorization': 'Bearer %s' % token})
    workers = ['--workers', str(args.workers)]
    targets = []
    for variant in args.variants.split(','):
        if variant == 'web':
            argv = [sys.executable, 'aijob.py', 'web'] + workers
            targets.append(('status_get', argv) + status)
        else:
            argv = [sys.executable, 'benchmarks/poll_variant.py', variant] + workers
            targets.append(('status_get[%s]' % variant, argv) + status)
    for floor in args.floors.split(','):
        argv = [sys.executable, 'benchmarks/poll_floor.py'] + workers
        name = 'floor' if floor == 'gevent' else 'floor_%s' % floor
        if floor == 'sync':
            argv.append('--sync')
        elif floor != 'gevent':
            raise SystemExit('poll_bench: --floors takes gevent and sync')
        targets.append((name, argv, '/job/%s' % job_id, {}))
    return targets


def drive(args, use_wrk, server, path, headers, duration_s):
    """(requests/s, p99 ms or None) of one run; any non-2xx answer stops the benchmark."""
    if use_wrk:
        rps, errors, p99 = run_wrk(
            server.port, path, headers, args.connections, duration_s, args.threads
        )
    else:
        (rps, errors), p99 = (
            run_python_client(server.port, path, headers, args.connections, duration_s),
            None,
        )
    if errors:
        raise SystemExit(
            'poll_bench: %s answered %d errors; its log: %s'
            % (server.name, errors, server.error_lines())
        )
    return rps, p99


def measure(args, use_wrk, server, path, headers, profile_to=None):
    """One measured run: {rps, p99, cpu_s, wait_s, spread, profile}."""
    workers = server.worker_pids()
    before = cpu_and_wait_s(workers)
    spy = start_profile(workers[0], args.duration, profile_to) if profile_to and workers else None
    spread = {}
    look = threading.Timer(
        args.duration / 2,
        lambda: spread.update(counts=connections_per_worker(server.port, workers)),
    )
    look.start()
    rps, p99 = drive(args, use_wrk, server, path, headers, args.duration)
    look.join()
    after = cpu_and_wait_s(workers)
    result = {'rps': rps, 'p99': p99, 'cpu_s': None, 'wait_s': None, 'profile': None}
    result['spread'] = spread.get('counts')
    if before and after:
        result['cpu_s'], result['wait_s'] = after[0] - before[0], after[1] - before[1]
    if spy is not None and spy.wait() == 0:
        result['profile'] = own_time(profile_to)
    return result


def describe(name, result):
    text = '%s %.1f requests/s' % (name, result['rps'])
    if result['p99'] is not None:
        text += ', p99 %.2f ms' % result['p99']
    if result['cpu_s'] is not None:
        text += ' (workers: %.2f s CPU, %.2f s waiting for a CPU)' % (
            result['cpu_s'],
            result['wait_s'],
        )
    if result['spread']:
        text += ', connections per worker %s' % '/'.join(map(str, result['spread']))
    return text


def describe_ratios(status_get, floor):
    text = 'requests/s %.2f' % (status_get['rps'] / floor['rps'])
    if status_get['p99'] and floor['p99']:
        text += ', p99 %.2f' % (status_get['p99'] / floor['p99'])
    return text


def print_profiles(results):
    for name, result in results.items():
        if result['profile']:
            print('profile of one %s worker, functions by own time:' % name)
            for share, function in result['profile']:
                print('  %5.1f%%  %s' % (100 * share, function))


def main(argv=None):
    args = parse_args(argv)
    config = load_config()
    if not config.database_url.startswith(('mysql:', 'mariadb:')) or not config.uses_redis:
        raise SystemExit('poll_bench: needs AIJOB_DATABASE_URL=mysql://… and AIJOB_REDIS_URL')
    token, job_id = prepare(config)
    use_wrk = shutil.which('wrk') and not args.python_client
    print(
        'load: %s, %d connections, %d s each after %d s of warm-up, %d workers'
        % (
            'wrk -t%d' % args.threads if use_wrk else 'python http.client threads',
            args.connections,
            args.duration,
            args.warmup,
            args.workers,
        )
    )
    if args.profile and not shutil.which('py-spy'):
        print('--profile: py-spy is not on PATH; no profile')
        args.profile = False
    targets = targets_for(args, token, job_id)
    servers = []
    seen = {name: [] for name, _, _, _ in targets}
    try:
        for name, server_argv, path, headers in targets:
            port = free_port()
            servers.append(Server(name, server_argv + ['--port', str(port)], port))
            servers[-1].wait_ready(path, headers)
        for server, (_, _, path, headers) in zip(servers, targets, strict=True):
            if args.warmup:
                drive(args, use_wrk, server, path, headers, args.warmup)
        for n in range(args.rounds):
            # Every server stays up and idle while another is driven; the order alternates so
            # that none always runs first after a pause.
            order = list(zip(servers, targets, strict=True))
            if n % 2:
                order.reverse()
            last = args.profile and n == args.rounds - 1
            results = {}
            for server, (name, _, path, headers) in order:
                profile_to = os.path.join(tempfile.gettempdir(), 'poll-bench-%s.raw' % name)
                results[name] = measure(
                    args, use_wrk, server, path, headers, profile_to if last else None
                )
                seen[name].append(results[name])
            for name, _, _, _ in targets:
                print('round %d: %s' % (n + 1, describe(name, results[name])))
            for status, floor in comparisons(targets):
                print(
                    'round %d: %s/%s: %s'
                    % (n + 1, status, floor, describe_ratios(results[status], results[floor]))
                )
            if last:
                print_profiles(results)
    finally:
        for server in servers:
            server.stop()
    print_summary(seen, targets)
    return 0


def comparisons(targets):
    """Every (status GET, floor) pair of names."""
    names = [name for name, _, _, _ in targets]
    floors = [name for name in names if name.startswith('floor')]
    return [(status, floor) for status in names if status not in floors for floor in floors]


def print_summary(seen, targets):
    """The medians over the rounds, per target; each ratio is the median of the per-round
    ratios. ``status_get_vs_floor=…`` lines as before for the pair web/gevent floor."""
    for name, _, _, _ in targets:
        tails = [r['p99'] for r in seen[name] if r['p99']]
        print(
            '%s: median %.1f requests/s%s'
            % (
                name,
                statistics.median(r['rps'] for r in seen[name]),
                ', p99 %.2f ms' % statistics.median(tails) if tails else '',
            )
        )
    for status, floor in comparisons(targets):
        print_pair(status, floor, list(zip(seen[status], seen[floor], strict=True)))


def print_pair(status, floor, pairs):
    label = '%s_vs_%s' % (status, floor)
    if (status, floor) == ('status_get', 'floor'):
        label = 'status_get_vs_floor'
    ratios = [s['rps'] / f['rps'] for s, f in pairs]
    print(
        '%s=%.2f (median of %d rounds: %s)'
        % (label, statistics.median(ratios), len(ratios), ', '.join('%.2f' % r for r in ratios))
    )
    tails = [(s['p99'], f['p99']) for s, f in pairs if s['p99'] and f['p99']]
    if tails:
        ratios = [s / f for s, f in tails]
        print(
            '%s_p99=%.2f (median of %d rounds: %s)'
            % (
                label,
                statistics.median(ratios),
                len(ratios),
                ', '.join('%.2f' % r for r in ratios),
            )
        )


if __name__ == '__main__':
    sys.exit(main())
