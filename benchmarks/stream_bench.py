"""How many job event streams one ``web`` process holds (issue 12, item 5).

On the configured MySQL/MariaDB + Redis (AIJOB_DATABASE_URL, AIJOB_REDIS_URL) it creates a token
and JOBS queued synthetic jobs (no worker runs, so they stay queued and their streams idle),
starts ``python aijob.py web --workers 1`` on a free port, then, for each count in --streams,
opens that many ``GET /api/ai/jobs/{id}/stream`` connections (spread over the jobs, WAVE at a
time) from one client thread and prints: the seconds to open them all (each has its opening
status), the web worker's resident memory and thread count with them open, the median /healthz
latency meanwhile, and the time until a change reaches every stream of a job (one job
cancelled). It stops only the process it started, by pid.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_bench \\
    AIJOB_REDIS_URL=redis://127.0.0.1:6379/3 python benchmarks/stream_bench.py
"""

import argparse
import functools
import http.client
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.core.service import CreateJobInput  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.http.auth import TokenStore  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

USER = 'stream-bench-%d' % os.getpid()  # a user of its own: its jobs stay queued
JOBS = 50
WAVE = 100  # streams opened at once
DONE = b'"lifecycleStatus":"cancelled"'  # in the final status event


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def prepare(config):
    """A token for USER and JOBS queued jobs of USER's; returns (token, job ids)."""
    runtime = Runtime(config, role='stream-bench')
    try:
        runtime.create_schema()
        with runtime.store.connection():
            token = TokenStore(runtime.store).create(USER)
            ids = []
            for i in range(JOBS):
                request = CreateJobInput(
                    user_id=USER,
                    job_type='synthetic',
                    target_type='bench',
                    target_id='stream-%d-%d' % (os.getpid(), i),
                    input={},
                )
                ids.append(runtime.service.create_job(request).job.id)
    finally:
        runtime.close()
    return token, ids


def children(pid):
    try:
        with open('/proc/%d/task/%d/children' % (pid, pid)) as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def proc_status(pid):
    """(resident MiB, threads) of a process."""
    fields = {}
    with open('/proc/%d/status' % pid) as handle:
        for line in handle:
            name, _, value = line.partition(':')
            fields[name] = value.strip()
    return int(fields['VmRSS'].split()[0]) / 1024.0, int(fields['Threads'])


class Streams:
    """Open event-stream connections, read by one thread with a selector."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.selector = selectors.DefaultSelector()
        self.buffers = {}  # socket -> bytes received

    def open(self, job_ids, count, timeout_s=120):
        """``count`` streams over ``job_ids``, WAVE at a time (clients arrive over time, not
        all in one instant); returns the seconds until all had their opening status."""
        started = time.monotonic()
        for first in range(0, count, WAVE):
            wave = [self._connect(job_ids[i % len(job_ids)]) for i in range(first, first + WAVE)]
            self.read_until(functools.partial(self.all_have, wave, b'event: status'), timeout_s)
        return time.monotonic() - started

    def _connect(self, job_id):
        sock = socket.create_connection(('127.0.0.1', self.port))
        request = (
            'GET /api/ai/jobs/%s/stream HTTP/1.1\r\nHost: bench\r\n'
            'Authorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n'
        ) % (job_id, self.token)
        sock.sendall(request.encode('ascii'))
        sock.setblocking(False)
        self.buffers[sock] = b''
        self.selector.register(sock, selectors.EVENT_READ, job_id)
        return sock

    def read_until(self, done, timeout_s):
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                heads = [b[:400] for b in self.buffers.values() if b[9:12] != b'200']
                waiting = [b for b in self.buffers.values() if b'event: status' not in b]
                raise SystemExit(
                    'stream_bench: timed out; %d not answered 200, e.g. %r; %d of %d without '
                    'their status, e.g. %r'
                    % (len(heads), heads[:3], len(waiting), len(self.buffers), waiting[:1])
                )
            for key, _ in self.selector.select(0.5):
                try:
                    chunk = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:  # the server ended it (the job ended)
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()
                    continue
                self.buffers[key.fileobj] += chunk

    def all_have(self, socks, marker):
        return all(marker in self.buffers[sock] for sock in socks)

    def of_job(self, job_id):
        return [key.fileobj for key in self.selector.get_map().values() if key.data == job_id]

    def close(self):
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fileobj)
            key.fileobj.close()
        self.buffers.clear()


def healthz_ms(port, samples=20):
    timings = []
    for _ in range(samples):
        conn = http.client.HTTPConnection('127.0.0.1', port, timeout=10)
        started = time.monotonic()
        conn.request('GET', '/healthz')
        conn.getresponse().read()
        timings.append((time.monotonic() - started) * 1000)
        conn.close()
    return statistics.median(timings)


def cancel(port, token, job_id):
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=10)
    headers = {'Authorization': 'Bearer ' + token}
    conn.request('POST', '/api/ai/jobs/%s/cancel' % job_id, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--streams', default='500,1000,2000,4000', help='counts to try')
    args = parser.parse_args()
    counts = [int(c) for c in args.streams.split(',')]
    config = load_config()
    token, job_ids = prepare(config)
    port = free_port()
    env = dict(
        os.environ,
        AIJOB_MAX_STREAMS=str(max(counts)),
        AIJOB_MAX_STREAMS_PER_USER=str(max(counts)),
        AIJOB_STREAM_MAX_S='3600',
    )
    log = tempfile.NamedTemporaryFile(prefix='aijob-stream-bench-', suffix='.log', delete=False)
    print('web log: %s' % log.name)
    web = subprocess.Popen(
        [sys.executable, 'aijob.py', 'web', '--workers', '1', '--port', str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                healthz_ms(port, 1)
                break
            except OSError:
                if time.monotonic() > deadline or web.poll() is not None:
                    raise SystemExit('stream_bench: web did not start') from None
                time.sleep(0.2)
        (worker,) = children(web.pid)
        idle_rss, idle_threads = proc_status(worker)
        print('web worker pid %d idle: %.1f MiB, %d threads' % (worker, idle_rss, idle_threads))
        for round_no, count in enumerate(counts):
            streams = Streams(port, token)
            open_s = streams.open(job_ids[round_no:], count)  # the jobs not cancelled yet
            rss, threads = proc_status(worker)
            health = healthz_ms(port)
            # A change reaches every stream of the job: cancel one (queued → cancelled).
            job_id = job_ids[round_no]
            watching = streams.of_job(job_id)
            assert watching
            started = time.monotonic()
            assert cancel(port, token, job_id) in (200, 202)
            try:
                streams.read_until(functools.partial(streams.all_have, watching, DONE), 30)
            except SystemExit:
                for sock in watching:
                    print(len(streams.buffers[sock]), streams.buffers[sock][-300:])
                raise
            change_ms = (time.monotonic() - started) * 1000
            streams.close()
            print(
                'streams=%d open_s=%.2f rss_mib=%.1f (+%.1f KiB/stream) threads=%d '
                'healthz_ms=%.1f change_to_%d_streams_ms=%.0f'
                % (
                    count,
                    open_s,
                    rss,
                    (rss - idle_rss) * 1024 / count,
                    threads,
                    health,
                    len(watching),
                    change_ms,
                )
            )
            time.sleep(1.0)  # the server notices the closed streams
    finally:
        if web.poll() is None:
            web.send_signal(signal.SIGTERM)
            try:
                web.wait(30)
            except subprocess.TimeoutExpired:
                web.kill()
                web.wait(10)
        log.close()


if __name__ == '__main__':
    main()
