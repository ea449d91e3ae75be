"""The live text of running jobs on their event streams (docs/architecture.md, decision 15): the
time from the provider's first chunk to the client's first delta (p50, p99), and the worker's
CPU per forwarded delta.

Latency, end to end: on the configured MySQL/MariaDB + Redis (AIJOB_DATABASE_URL,
AIJOB_REDIS_URL) it starts ``python aijob.py web --workers 1`` and ``python aijob.py worker``
against a loopback OpenAI-compatible server (tests/support/fake_openai.py) that streams each
job's text in CHUNKS pieces CHUNK_DELAY_S apart, after FIRST_DELAY_S. For each of --jobs
flashcard jobs (--concurrency at a time) a client thread creates the job, opens its stream, and
notes when the first ``event: delta`` arrives; the fake notes when it wrote the first piece of
text. Every client checks it got the whole text, in order. Also printed: the worker process's
whole CPU per job (/proc), for scale.

``--embedded`` measures the embedded default instead: one ``python aijob.py serve`` on a SQLite
file, with the in-process channel (the CPU figure then is the serve process's, API included).

CPU per forwarded delta, in this process: CALLS simulated provider calls write CHUNKS pieces each,
CHUNK_DELAY_S apart, into the worker's pump (execution/deltas.py) over the Redis channel (the
in-process one with --embedded); the process CPU of that run less the CPU of the same writers
with nobody forwarding, divided by the messages forwarded: what coalescing and sending costs the
worker, per message.

It stops only the processes it started, by pid.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_bench \\
    AIJOB_REDIS_URL=redis://127.0.0.1:6379/3 python benchmarks/text_bench.py
"""

import argparse
import http.client
import json
import os
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

from engine.extensions import load_config  # noqa: E402
from engine.features.streams.channel import MemoryTextChannel, RedisTextChannel  # noqa: E402
from engine.features.streams.pump import DeltaPump  # noqa: E402
from engine.http.auth import TokenStore  # noqa: E402
from engine.runtime import Runtime  # noqa: E402
from tests.support.fake_openai import FakeOpenAI, json_reply  # noqa: E402

USER = 'text-bench-%d' % os.getpid()
PREFIX = 'text-bench-%d' % os.getpid()  # this run's Redis keys, removed at the end
CHUNKS = 100
CHUNK_DELAY_S = 0.02  # 100 pieces in 2 s: about 20 messages per job after coalescing
FIRST_DELAY_S = 0.5  # the client's stream is open before the first piece
CARDS = {'cards': [{'question': 'Question %d?' % n, 'answer': 'Answer %d' % n} for n in range(30)]}
TEXT = json.dumps(CARDS)
CALLS = 50  # simulated provider calls at once, for the CPU figure


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def prepare(config):
    runtime = Runtime(config, role='text-bench')
    try:
        runtime.create_schema()
        with runtime.store.connection():
            return TokenStore(runtime.store).create(USER)
    finally:
        runtime.close()


def children(pid):
    with open('/proc/%d/task/%d/children' % (pid, pid)) as handle:
        return [int(p) for p in handle.read().split()]


def cpu_s(pid):
    """User + system CPU seconds of a process so far."""
    with open('/proc/%d/stat' % pid) as handle:
        fields = handle.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def start(args, env, log):
    return subprocess.Popen(
        [sys.executable, 'aijob.py'] + args,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_healthy(port, proc):
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
            conn.request('GET', '/healthz')
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit('text_bench: web did not start')
        time.sleep(0.2)


def follow_one(port, token, number, results):
    """Create a job, read its stream to the end; appends (marker, first delta arrival, text,
    deltas): the marker is in the job's input, so in its provider request too."""
    headers = {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'}
    marker = 'text-bench-job-%d' % number
    body = {
        'jobType': 'flashcard_generation',
        'targetType': 'bench',
        'targetId': 'text',
        'input': {'text': 'Something to learn: %s.' % marker, 'maxCards': 30},
    }
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=60)
    conn.request('POST', '/api/ai/jobs', json.dumps(body), headers)
    answer = conn.getresponse()
    job_id = json.loads(answer.read())['jobId']
    conn.request(
        'GET',
        '/api/ai/jobs/%s/stream' % job_id,
        headers={'Authorization': headers['Authorization']},
    )
    answer = conn.getresponse()
    first, pieces = None, []
    event = None
    while True:
        line = answer.readline()
        if not line:
            break
        line = line.decode('utf-8').rstrip('\r\n')
        if line.startswith('event: '):
            event = line[len('event: ') :]
        elif line.startswith('data: ') and event == 'delta':
            if first is None:
                first = time.monotonic()
            pieces.append(json.loads(line[len('data: ') :])['text'])
    conn.close()
    results.append((marker, first, ''.join(pieces), len(pieces)))


def latency(args, config, token):
    fake = FakeOpenAI().start()
    reply = json_reply(CARDS, chunks=CHUNKS, delay_s=CHUNK_DELAY_S, first_delay_s=FIRST_DELAY_S)
    fake.script(reply)
    port = free_port()
    env = dict(
        os.environ,
        AIJOB_PROVIDER_BASE_URL=fake.base_url,
        AIJOB_PLATFORM_API_KEY='sk-text-bench-0000',
        AIJOB_MAX_STREAMS_PER_USER='1000',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='1000',
        AIJOB_DAILY_JOB_QUOTA='100000',
        AIJOB_REDIS_PREFIX=PREFIX,
    )
    log = tempfile.NamedTemporaryFile(prefix='aijob-text-bench-', suffix='.log', delete=False)
    print('server log: %s' % log.name)
    if args.embedded:  # one process: its gunicorn worker runs the API and the job threads
        web = start(['serve', '--port', str(port)], env, log)
        worker = web
    else:
        web = start(['web', '--workers', '1', '--port', str(port)], env, log)
        worker = start(['worker'], env, log)
    try:
        wait_healthy(port, web)
        time.sleep(2.0)  # the worker's pools are up
        worker_pid = children(web.pid)[0] if args.embedded else worker.pid
        cpu_before = cpu_s(worker_pid)
        results = []
        for start_no in range(0, args.jobs, args.concurrency):
            wave = min(args.concurrency, args.jobs - start_no)
            threads = [
                threading.Thread(target=follow_one, args=(port, token, start_no + n, results))
                for n in range(wave)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
        worker_cpu = cpu_s(worker_pid) - cpu_before
    finally:
        stop(web)
        stop(worker)  # (the same process when embedded: stopping it twice is a no-op)
        fake.stop()
        log.close()
    assert all(text == TEXT for _, _, text, _ in results), 'a client missed text'
    started = {}  # marker -> when the fake wrote the first piece of that job's text
    for request in fake.requests:
        prompt = json.dumps(request.get('messages'))
        for marker, _, _, _ in results:
            if marker + '.' in prompt:
                started[marker] = request['_text_started']
    waits = [(first - started[marker]) * 1000 for marker, first, _, _ in results]
    deltas = sum(count for _, _, _, count in results)
    print(
        'jobs=%d concurrency=%d chunks/job=%d deltas/job=%.1f first_delta_ms p50=%.1f p99=%.1f '
        'max=%.1f worker_cpu_ms/job=%.2f'
        % (
            len(results),
            args.concurrency,
            CHUNKS,
            deltas / len(results),
            statistics.median(waits),
            percentile(waits, 99),
            max(waits),
            worker_cpu * 1000 / len(results),
        )
    )


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


class _Nowhere:
    def write(self, text):
        pass

    def close(self):
        pass


def writers(open_sink):
    """CALLS threads, each a provider call writing CHUNKS pieces CHUNK_DELAY_S apart."""
    piece = TEXT[: max(1, len(TEXT) // CHUNKS)]

    def call(number):
        sink = open_sink('text-bench-%d-%d' % (os.getpid(), number))
        for _ in range(CHUNKS):
            sink.write(piece)
            time.sleep(CHUNK_DELAY_S)
        sink.close()

    threads = [threading.Thread(target=call, args=(n,)) for n in range(CALLS)]
    started = time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.process_time() - started


def cpu_per_delta(config):
    baseline = writers(lambda job_id: _Nowhere())
    ttl_ms, most = config.stream_text_ttl_ms, config.stream_text_max_messages
    if config.redis_url:
        channel = RedisTextChannel(config.redis_url, PREFIX, ttl_ms, most)
    else:
        channel = MemoryTextChannel(ttl_ms, most)
    pump = DeltaPump(channel)
    try:
        forwarding = writers(pump.open)
    finally:
        pump.stop()
    if config.redis_url:
        keys = list(channel.redis.scan_iter(match=PREFIX + ':*', count=1000))
        if keys:
            channel.redis.delete(*keys)  # this run's keys only, never a whole database
    channel.close()
    print(
        'calls=%d chunks/call=%d messages=%d cpu_ms: with forwarding %.1f, without %.1f; '
        'worker_cpu_us/delta=%.0f'
        % (
            CALLS,
            CHUNKS,
            pump.forwarded,
            forwarding * 1000,
            baseline * 1000,
            (forwarding - baseline) * 1e6 / max(1, pump.forwarded),
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--jobs', type=int, default=100)
    parser.add_argument('--concurrency', type=int, default=10)
    parser.add_argument(
        '--embedded',
        action='store_true',
        help='the embedded default instead: one serve process, SQLite, the in-process channel',
    )
    args = parser.parse_args()
    if args.embedded:
        folder = tempfile.mkdtemp(prefix='aijob-text-bench-')
        os.environ['AIJOB_DATABASE_URL'] = 'sqlite:///%s/aijob.db' % folder
        os.environ['AIJOB_REDIS_URL'] = ''
    config = load_config()
    if not config.redis_url and not args.embedded:
        raise SystemExit('text_bench: set AIJOB_REDIS_URL (web and worker are two processes)')
    token = prepare(config)
    latency(args, config, token)
    cpu_per_delta(config)


if __name__ == '__main__':
    main()
