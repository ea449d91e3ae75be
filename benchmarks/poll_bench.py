"""Status GET against its floor (issue 9, item 5).

On the configured MySQL/MariaDB + Redis (AIJOB_DATABASE_URL, AIJOB_REDIS_URL) it creates a token
and one finished synthetic job, starts ``python aijob.py web --workers 4`` and the bare floor app
(``benchmarks/poll_floor.py``, same gunicorn settings, one primary-key read) on free ports, drives
each in turn with ``wrk -c16 -d10s`` when ``wrk`` is installed, else with a Python client of 16
keep-alive http.client connections (threads, spread over two processes so one GIL does not cap
it), in ``--rounds`` alternating rounds with both servers up, and prints each round's
requests/s and ratio and, last, the medians: ``status_get_rps=… floor_rps=…
status_get_vs_floor=…`` (the median of the per-round ratios) and, with wrk, each round's p99 of both
and their median ratio ``status_get_p99_vs_floor``. It stops only the processes it
started, by pid.

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

from engine.core.config import Config  # noqa: E402
from engine.core.lifecycle import TERMINAL  # noqa: E402
from engine.core.models import AiJob  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
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
def run_wrk(port, path, headers, connections, duration_s):
    argv = ['wrk', '-t2', '-c%d' % connections, '-d%ds' % duration_s, '--latency']
    for name, value in headers.items():
        argv += ['-H', '%s: %s' % (name, value)]
    out = subprocess.run(
        argv + ['http://127.0.0.1:%d%s' % (port, path)], capture_output=True, text=True
    ).stdout
    match = re.search(r'Requests/sec:\s*([\d.]+)', out)
    if not match:
        raise SystemExit('poll_bench: no figure from wrk:\n%s' % out)
    errors = re.search(r'Non-2xx or 3xx responses:\s*(\d+)', out)
    return float(match.group(1)), int(errors.group(1)) if errors else 0, wrk_p99_ms(out)


WRK_UNITS_MS = {'us': 0.001, 'ms': 1.0, 's': 1000.0, 'm': 60_000.0}


def wrk_p99_ms(out):
    """The 99th percentile of wrk's ``--latency`` distribution, in ms (None if absent)."""
    match = re.search(r'^\s*99%\s+([\d.]+)(us|ms|s|m)\s*$', out, re.M)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workers', type=int, default=4, help='gunicorn workers of both apps')
    parser.add_argument('--connections', type=int, default=16)
    parser.add_argument('--duration', type=int, default=10, help='seconds per target')
    parser.add_argument('--rounds', type=int, default=5, help='alternating rounds')
    parser.add_argument('--python-client', action='store_true', help='even if wrk is installed')
    args = parser.parse_args(argv)
    config = Config.from_env()
    if not config.database_url.startswith(('mysql:', 'mariadb:')) or not config.uses_redis:
        raise SystemExit('poll_bench: needs AIJOB_DATABASE_URL=mysql://… and AIJOB_REDIS_URL')
    token, job_id = prepare(config)
    use_wrk = shutil.which('wrk') and not args.python_client
    print(
        'load: %s, %d connections, %d s each'
        % ('wrk' if use_wrk else 'python http.client threads', args.connections, args.duration)
    )
    targets = (
        (
            'status_get',
            [sys.executable, 'aijob.py', 'web', '--workers', str(args.workers)],
            '/api/ai/jobs/%s' % job_id,
            {'Authorization': 'Bearer %s' % token},
        ),
        (
            'floor',
            [sys.executable, 'benchmarks/poll_floor.py', '--workers', str(args.workers)],
            '/job/%s' % job_id,
            {},
        ),
    )
    servers = []
    try:
        for name, server_argv, path, headers in targets:
            port = free_port()
            servers.append(Server(name, server_argv + ['--port', str(port)], port))
            servers[-1].wait_ready(path, headers)
        ratios, tails, seen = [], [], {'status_get': [], 'floor': []}
        for n in range(args.rounds):
            # Both servers stay up and idle while the other is driven; the order alternates so
            # that neither always runs first after a pause.
            order = list(zip(servers, targets, strict=True))
            if n % 2:
                order.reverse()
            rps, p99 = {}, {}
            for server, (name, _, path, headers) in order:
                if use_wrk:
                    rps[name], errors, p99[name] = run_wrk(
                        server.port, path, headers, args.connections, args.duration
                    )
                else:
                    rps[name], errors = run_python_client(
                        server.port, path, headers, args.connections, args.duration
                    )
                if errors:
                    raise SystemExit('poll_bench: %s answered %d errors' % (name, errors))
            ratios.append(rps['status_get'] / rps['floor'])
            for name, value in rps.items():
                seen[name].append(value)
            print(
                'round %d: status_get %.1f requests/s, floor %.1f, ratio %.2f'
                % (n + 1, rps['status_get'], rps['floor'], ratios[-1])
            )
            if p99.get('status_get') and p99.get('floor'):  # wrk's latency distribution
                tails.append(p99['status_get'] / p99['floor'])
                print(
                    'round %d: p99 status_get %.2f ms, floor %.2f ms, ratio %.2f'
                    % (n + 1, p99['status_get'], p99['floor'], tails[-1])
                )
    finally:
        for server in servers:
            server.stop()
    print(
        'status_get_rps=%.1f floor_rps=%.1f status_get_vs_floor=%.2f (median of %d rounds: %s)'
        % (
            statistics.median(seen['status_get']),
            statistics.median(seen['floor']),
            statistics.median(ratios),
            len(ratios),
            ', '.join('%.2f' % r for r in ratios),
        )
    )
    if tails:
        print(
            'status_get_p99_vs_floor=%.2f (median of %d rounds: %s)'
            % (statistics.median(tails), len(tails), ', '.join('%.2f' % r for r in tails))
        )
    return 0


if __name__ == '__main__':
    sys.exit(main())
