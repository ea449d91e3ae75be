"""How close to a provider's rate limit three worker processes call it (README "Provider rate
limits"; the rate that tests/features/rate_limits/test_ratelimit_processes.py pins no more,
a rate being a speed).

Each round runs that test's set-up (tests/support/rate_limited.py): a loopback OpenAI-compatible
server (tests/support/fake_openai.py) that answers 429 beyond --limit requests in any --window-ms,
--workers ``python aijob.py worker`` processes (tests/support/worker_processes.py) on MariaDB +
Redis holding that limit, and --jobs flashcard
jobs, and waits for every job to end. Printed per round: the requests the provider answered,
those that came over its limit (each answered 429, so its job retried), the deferrals, the
steady rate (the requests past the first window's burst over the time from the first answer to
the last) and its % of the limit, and the time to spare at the closest approach (the shortest
span of limit + 1 consecutive answers, less the window: 0 is one request short of a 429). Then
the medians over the rounds. A request counts from its reservation until a window after its
response, so the steady rate is capped at window / (window + the time from a reservation to its
answer, the wake-up's lateness included).

The database (--database-url, created if missing) has its tables emptied each round and is
dropped at the end if this run created it; each round has a Redis prefix of its own, deleted at
the end. It stops only the processes it started, by pid.

    python benchmarks/ratelimit_rate.py [--rounds 3] [--jobs 200] [--limit 40] \\
        [--window-ms 4000] [--workers 3] \\
        [--database-url mysql://root@127.0.0.1:3306/bench_ratelimit] \\
        [--redis-url redis://127.0.0.1:6379/0]
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import uuid
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pymysql  # noqa: E402

from engine.core.models import AiJob, AiJobEvent  # noqa: E402
from engine.core.states import TERMINAL  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.runtime import Runtime  # noqa: E402
from tests.support.backends import delete_redis_keys, reset_tables  # noqa: E402
from tests.support.fake_openai import FakeOpenAI  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402
from tests.support.rate_limited import create_jobs, limit_fake, settings  # noqa: E402
from tests.support.worker_processes import Worker  # noqa: E402

DATABASE_URL = 'mysql://root@127.0.0.1:3306/bench_ratelimit'
REDIS_URL = 'redis://127.0.0.1:6379/0'


def mysql(url):
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
    ), parts.path.strip('/')


def create_database(url):
    """Create the database if missing; True if this call created it."""
    conn, name = mysql(url)
    with conn.cursor() as cursor:
        missing = not cursor.execute(
            'SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s', (name,)
        )
        if missing:
            cursor.execute('CREATE DATABASE `%s` CHARACTER SET utf8mb4' % name)
    conn.close()
    return missing


def drop_database(url):
    conn, name = mysql(url)
    with conn.cursor() as cursor:
        cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
    conn.close()


def one_round(args, folder):
    """The figures of one round: a dict."""
    window_s = args.window_ms / 1000.0
    fake = limit_fake(FakeOpenAI().start(), args.limit, window_s)
    prefix = 'bench-ratelimit-%s' % uuid.uuid4().hex[:8]
    env = dict(
        settings(fake.base_url, args.limit, window_s),
        AIJOB_DATABASE_URL=args.database_url,
        AIJOB_REDIS_URL=args.redis_url,
        AIJOB_REDIS_PREFIX=prefix,
    )
    runtime = Runtime(load_config(env), role='bench')
    workers = []
    try:
        runtime.create_schema()
        reset_tables(runtime)
        workers = [Worker(folder, env) for _ in range(args.workers)]
        with runtime.store.connection():
            create_jobs(runtime, args.jobs)
            wait_ended(args)
            deferrals = AiJobEvent.select().where(AiJobEvent.kind == 'deferred').count()
            succeeded = AiJob.select().where(AiJob.lifecycle_status == 'succeeded').count()
    finally:
        for worker in workers:
            worker.close()
        fake.stop()
        runtime.close()
        delete_redis_keys(prefix, args.redis_url)
    answered = sorted(fake.answered_at)
    steady = (len(answered) - args.limit) / (answered[-1] - answered[0])
    return {
        'requests': len(answered),
        'over': fake.over_limit,
        'deferrals': deferrals,
        'succeeded': succeeded,
        'steady': steady,
        'percent': 100.0 * steady * window_s / args.limit,
        'spare_ms': spare_ms(answered, args.limit, window_s),
    }


def spare_ms(answered, limit, window_s):
    """The shortest span of limit + 1 consecutive answers, less the window (ms): how near the
    provider came to answering a 429 (NaN with too few answers)."""
    spans = [answered[i + limit] - answered[i] for i in range(len(answered) - limit)]
    return (min(spans) - window_s) * 1000.0 if spans else float('nan')


def wait_ended(args):
    """Every job ended, within ten times its slots' time (a 429's retry waits too)."""
    slots_s = args.jobs / args.limit * args.window_ms / 1000.0
    wait_until(
        lambda: not AiJob.select().where(AiJob.lifecycle_status.not_in(TERMINAL)).count(),
        timeout=60 + 10 * slots_s,
        interval=0.2,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--jobs', type=int, default=200)
    parser.add_argument('--limit', type=int, default=40, help='requests per window')
    parser.add_argument('--window-ms', type=int, default=4000)
    parser.add_argument('--workers', type=int, default=3)
    parser.add_argument('--database-url', default=DATABASE_URL, help='MySQL/MariaDB')
    parser.add_argument('--redis-url', default=REDIS_URL)
    args = parser.parse_args()
    if args.jobs <= args.limit:
        raise SystemExit('ratelimit_rate: --jobs must exceed --limit (no steady rate otherwise)')
    created = create_database(args.database_url)
    rounds = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for number in range(1, args.rounds + 1):
                rounds.append(one_round(args, pathlib.Path(folder)))
                print('round %d: %s' % (number, describe(rounds[-1], args)), flush=True)
    finally:
        if created:
            drop_database(args.database_url)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        'median over %d rounds (limit %d per %d ms, %d workers): %s'
        % (
            args.rounds,
            args.limit,
            args.window_ms,
            args.workers,
            describe(median, args),
        )
    )


def describe(figures, args):
    return (
        '%d requests, %d over the limit, %d deferrals, %d/%d succeeded, %.2f req/s after the '
        'first window (%.0f%% of the limit), %.0f ms to spare at the closest'
        % (
            figures['requests'],
            figures['over'],
            figures['deferrals'],
            figures['succeeded'],
            args.jobs,
            figures['steady'],
            figures['percent'],
            figures['spare_ms'],
        )
    )


if __name__ == '__main__':
    main()
