"""The bench on one Redis against a 3-master Redis Cluster with 1 and 4 queue shards (issue 13's
closing note), in one run on this machine.

    python benchmarks/redis_topologies.py [--jobs 1000] [--rounds 3] [--concurrency 8]
                                          [--sleep-ms 0]

Starts its own servers on free ports (a redis-server, a 3-master cluster; no persistence) and
uses its own database on the local MariaDB (``bench_topologies``, dropped at the end). Each
round runs ``python aijob.py bench`` once per setup, in turn (so the machine's noise spreads
over all three), and the figures are the medians over the rounds: e2e jobs/s, create→running
p50/p99, and the ratio of each setup's throughput to one Redis's, per round, then its median.
The bench is bound by the database; so each round also times the queue alone
(``--queue-messages``, 0 to skip): pushes in batches of 100, then 4 consumer threads popping and
acking every message, in messages per second. Stops only the servers it started, by pid.
"""

import argparse
import os
import pathlib
import re
import statistics
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

from engine.dispatch.queue import Message  # noqa: E402
from engine.dispatch.redis_queue import RedisQueue  # noqa: E402
from tests.support.servers import PrivateRedisCluster, RedisProcess  # noqa: E402

DATABASE_URL = 'mysql://root@127.0.0.1:3306/bench_topologies'
FIGURES = ('e2e_jobs_per_s', 'create_to_running_p50_ms', 'create_to_running_p99_ms')


def database(url, action):
    parts = urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username or 'root'
    )
    with conn.cursor() as cursor:
        name = parts.path.strip('/')
        if action == 'create':
            cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
            cursor.execute('CREATE DATABASE `%s` CHARACTER SET utf8mb4' % name)
        else:
            cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
    conn.close()


def bench(args, redis_url, shards, prefix):
    env = dict(
        os.environ,
        AIJOB_DATABASE_URL=args.database_url,
        AIJOB_REDIS_URL=redis_url,
        AIJOB_QUEUE_SHARDS=str(shards),
        AIJOB_REDIS_PREFIX=prefix,
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )
    command = [sys.executable, os.path.join(ROOT, 'aijob.py'), 'bench', '--jobs', str(args.jobs)]
    command += ['--concurrency', str(args.concurrency), '--sleep-ms', str(args.sleep_ms)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit('bench failed:\n' + done.stdout[-2000:] + done.stderr[-2000:])
    summary = [line for line in done.stdout.splitlines() if line.startswith('e2e_jobs_per_s=')]
    found = dict(re.findall(r'(\w+)=(\S+)', summary[-1] if summary else ''))
    if found.get('succeeded') != '%d/%d' % (args.jobs, args.jobs):
        raise SystemExit('not every job succeeded: %s' % found.get('succeeded'))
    return {name: float(found[name]) for name in FIGURES}


def queue_only(redis_url, shards, count, consumers=4):
    """Messages per second through the queue alone: ``count`` pushed in batches of 100, then
    ``consumers`` threads pop and ack until every one is taken."""
    queue = RedisQueue(redis_url, prefix='qbench-%s' % uuid.uuid4().hex[:8], shards=shards)
    messages = [
        Message.for_job(uuid.uuid4().hex, 'synthetic', 'ai-interactive', 50) for _ in range(count)
    ]
    started = time.monotonic()
    for i in range(0, count, 100):
        queue.push_many(messages[i : i + 100])
    pushed = time.monotonic()
    taken = []

    def consume(n):
        while len(taken) < count:
            delivery = queue.pop('ai-interactive', 'qbench-%d' % n, 0.2)
            if delivery is not None:
                queue.ack(delivery)
                taken.append(1)

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = time.monotonic()
    queue.close()
    return {
        'push_per_s': round(count / (pushed - started), 1),
        'pop_ack_per_s': round(count / (done - pushed), 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--jobs', type=int, default=1000)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--concurrency', type=int, default=8)
    parser.add_argument('--sleep-ms', type=int, default=0)
    parser.add_argument('--database-url', default=DATABASE_URL)
    parser.add_argument('--queue-messages', type=int, default=2000)
    args = parser.parse_args()

    folder = pathlib.Path(tempfile.mkdtemp(prefix='aijob-topologies-'))
    single = RedisProcess(folder / 'single').start()
    cluster = PrivateRedisCluster(folder / 'cluster', masters=3).start()
    setups = (
        ('one Redis, 1 shard', 'redis://%s/0' % single.address, 1),
        ('cluster, 1 shard', cluster.url, 1),
        ('cluster, 4 shards', cluster.url, 4),
    )
    results = {name: [] for name, _, _ in setups}
    queue_results = {name: [] for name, _, _ in setups}
    database(args.database_url, 'create')
    try:
        for round_no in range(args.rounds):
            for i, (name, url, shards) in enumerate(setups):
                figures = bench(args, url, shards, 'bench-%d-%d' % (round_no, i))
                results[name].append(figures)
                print('round %d  %-18s %s' % (round_no + 1, name, figures), flush=True)
            for name, url, shards in setups if args.queue_messages else ():
                figures = queue_only(url, shards, args.queue_messages)
                queue_results[name].append(figures)
                print('round %d  %-18s queue only %s' % (round_no + 1, name, figures), flush=True)
    finally:
        cluster.stop()
        single.stop()
        database(args.database_url, 'drop')

    base = [r['e2e_jobs_per_s'] for r in results[setups[0][0]]]
    print(
        '\n%d jobs, concurrency %d, sleep %d ms, medians of %d rounds (MariaDB, one worker '
        'process):' % (args.jobs, args.concurrency, args.sleep_ms, args.rounds)
    )
    for name, _, _ in setups:
        runs = results[name]
        medians = {f: statistics.median(r[f] for r in runs) for f in FIGURES}
        ratio = statistics.median(r['e2e_jobs_per_s'] / b for r, b in zip(runs, base, strict=True))
        print(
            '  %-18s e2e_jobs_per_s=%.1f  create_to_running_p50_ms=%.1f  p99_ms=%.1f  '
            'vs one Redis x%.2f'
            % (
                name,
                medians['e2e_jobs_per_s'],
                medians['create_to_running_p50_ms'],
                medians['create_to_running_p99_ms'],
                ratio,
            )
        )

    if not args.queue_messages:
        return
    print('\nthe queue alone, %d messages, 4 consumer threads, medians:' % args.queue_messages)
    base = [r['pop_ack_per_s'] for r in queue_results[setups[0][0]]]
    for name, _, _ in setups:
        runs = queue_results[name]
        ratio = statistics.median(r['pop_ack_per_s'] / b for r, b in zip(runs, base, strict=True))
        print(
            '  %-18s push_per_s=%.0f  pop_ack_per_s=%.0f  vs one Redis x%.2f'
            % (
                name,
                statistics.median(r['push_per_s'] for r in runs),
                statistics.median(r['pop_ack_per_s'] for r in runs),
                ratio,
            )
        )


if __name__ == '__main__':
    main()
