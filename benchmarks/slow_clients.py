"""Slow clients and long polls against `web` (issue 10, item 1): /healthz and plain GET latency.

On MySQL/MariaDB + Redis (AIJOB_DATABASE_URL, AIJOB_REDIS_URL; defaults below) it creates the
schema, ``--users`` tokens and ``--jobs`` queued synthetic jobs per user (no worker runs, so they
stay queued), starts ``python aijob.py web --workers 2`` on a free port, then opens at once
``--slow`` slow-body clients (headers, ``Content-Length: 500``, 11 body bytes, held) and
``--polls`` long polls (``?waitMs=30000``, spread over the users and jobs, at most
AIJOB_MAX_WAITERS_PER_USER per user), and while they are all held measures ``--samples``
sequential ``GET /healthz`` and plain ``GET /api/ai/jobs/{id}`` requests (for ``--max-seconds`` at
most, inside the polls' 30 s), each on a new
connection. It prints p50/p99/max of both, how many polls were still waiting when the
measurement ended (none may have been refused or answered early), and last one line
``healthz_p99_ms=… get_p99_ms=… polls_waiting=…/…``. Target: both p99 under 200 ms. It stops
only the process it started, by pid.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_web \\
    AIJOB_REDIS_URL=redis://127.0.0.1:6379/0 python benchmarks/slow_clients.py
"""

import argparse
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.extensions import load_config  # noqa: E402
from engine.http.auth import TokenStore  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

DEFAULT_DB = 'mysql://root@127.0.0.1:3306/test_web'
DEFAULT_REDIS = 'redis://127.0.0.1:6379/0'


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def request(port, method, path, token=None, body=None):
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=60)
    headers = {'Authorization': 'Bearer ' + token} if token else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode('utf-8')
        headers['Content-Type'] = 'application/json'
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_healthy(port, proc, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit('web exited with %s' % proc.returncode)
        try:
            if request(port, 'GET', '/healthz')[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit('web did not answer within %ds' % timeout_s)


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def readable(socks):
    """The sockets with something to read now (poll: select() stops at descriptor 1023)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return poller.poll(0)


def raw(port, data):
    sock = socket.create_connection(('127.0.0.1', port), timeout=60)
    sock.sendall(data)
    return sock


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--polls', type=int, default=1000)
    parser.add_argument('--slow', type=int, default=8)
    parser.add_argument('--users', type=int, default=25)
    parser.add_argument('--jobs', type=int, default=4, help='queued jobs per user')
    parser.add_argument('--samples', type=int, default=300)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument(
        '--max-seconds', type=float, default=20.0, help='stop sampling after this long'
    )
    args = parser.parse_args()

    env = dict(os.environ)
    env.setdefault('AIJOB_DATABASE_URL', DEFAULT_DB)
    env.setdefault('AIJOB_REDIS_URL', DEFAULT_REDIS)
    env['AIJOB_REDIS_PREFIX'] = 'slowbench-%s' % uuid.uuid4().hex[:8]
    env.setdefault('AIJOB_MAX_ACTIVE_JOBS_PER_USER', '0')
    config = load_config(env)
    runtime = Runtime(config, role='bench')
    runtime.create_schema()
    with runtime.store.connection():
        tokens = [TokenStore(runtime.store).create('slow-%d' % i) for i in range(args.users)]
    runtime.close()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix='slow_clients-', suffix='.log', delete=False)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'web', '--port', str(port)]
        + ['--workers', str(args.workers)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    held = []
    try:
        wait_healthy(port, proc)
        jobs = {}
        for token in tokens:
            jobs[token] = []
            for n in range(args.jobs):
                status, body = request(
                    port,
                    'POST',
                    '/api/ai/jobs',
                    token,
                    {'jobType': 'synthetic', 'targetType': 'bench', 'targetId': str(n)},
                )
                assert status == 201, body
                jobs[token].append(json.loads(body)['jobId'])
        probe_token, probe_job = tokens[0], jobs[tokens[0]][0]

        started = time.monotonic()
        for _ in range(args.slow):
            held.append(
                raw(
                    port,
                    (
                        'POST /api/ai/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n'
                        'Content-Type: application/json\r\nContent-Length: 500\r\n\r\n'
                        '{"jobType":' % probe_token
                    ).encode('latin-1'),
                )
            )
        polls = []
        for i in range(args.polls):
            token = tokens[i % len(tokens)]
            job_id = jobs[token][(i // len(tokens)) % len(jobs[token])]
            polls.append(
                raw(
                    port,
                    (
                        'GET /api/ai/jobs/%s?waitMs=30000 HTTP/1.1\r\nHost: x\r\n'
                        'Authorization: Bearer %s\r\n\r\n' % (job_id, token)
                    ).encode('latin-1'),
                )
            )
        held.extend(polls)
        opened_s = time.monotonic() - started
        time.sleep(2.0)  # every poll is in and waiting

        healthz, plain = [], []
        sampling_until = time.monotonic() + args.max_seconds  # well inside the polls' 30 s
        for _ in range(args.samples):
            if time.monotonic() > sampling_until:
                break
            t0 = time.monotonic()
            assert request(port, 'GET', '/healthz')[0] == 200
            healthz.append((time.monotonic() - t0) * 1000)
            t0 = time.monotonic()
            assert request(port, 'GET', '/api/ai/jobs/' + probe_job, probe_token)[0] == 200
            plain.append((time.monotonic() - t0) * 1000)
        measured_s = time.monotonic() - started

        waiting = len(polls) - len(readable(polls))  # readable: refused or answered early
        for name, values in (('healthz', healthz), ('plain GET', plain)):
            print(
                '%-10s n=%d p50=%.1fms p99=%.1fms max=%.1fms'
                % (
                    name,
                    len(values),
                    percentile(values, 0.5),
                    percentile(values, 0.99),
                    max(values),
                )
            )
        print(
            'load: %d slow-body clients + %d long polls opened in %.2fs, measured over %.1fs '
            '(web, %d workers, server log %s)'
            % (args.slow, args.polls, opened_s, measured_s, args.workers, log.name)
        )
        print(
            'healthz_p99_ms=%.1f get_p99_ms=%.1f polls_waiting=%d/%d'
            % (percentile(healthz, 0.99), percentile(plain, 0.99), waiting, len(polls))
        )
    finally:
        for sock in held:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


if __name__ == '__main__':
    main()
