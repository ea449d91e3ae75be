"""What one leader for the housekeeping saves (issue 13 item 3): the database statements idle
worker processes send, leader against followers, with the default intervals.

    python benchmarks/leader_polling.py [--workers 3] [--seconds 60] [--rounds 3]

Each round starts ``--workers`` idle ``python aijob.py worker`` processes on its own database on
the local MariaDB (``bench_leader``, dropped at the end) and the local Redis (a prefix of its
own, deleted at the end), lets them idle ``--seconds``, stops them with SIGTERM and reads the
statements each sent from its ``worker.stopped`` line (start-up and stop included). Printed:
statements per second of the leader and of a follower (medians over the rounds), and the total
against what every process polling as the leader did would send (the median of per-round
ratios). Stops only the processes it started, by pid.
"""

import argparse
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pymysql  # noqa: E402
import redis  # noqa: E402

from tests.support.worker_processes import log_events  # noqa: E402

DATABASE_URL = 'mysql://root@127.0.0.1:3306/bench_leader'
REDIS_URL = 'redis://127.0.0.1:6379/0'


def database(action):
    parts = urlsplit(DATABASE_URL)
    conn = pymysql.connect(host=parts.hostname, port=parts.port or 3306, user=parts.username)
    with conn.cursor() as cursor:
        name = parts.path.strip('/')
        cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
        if action == 'create':
            cursor.execute('CREATE DATABASE `%s` CHARACTER SET utf8mb4' % name)
    conn.close()


def one_round(folder, workers, seconds):
    """{'leader': statements/s, 'followers': [statements/s, …]} of one round."""
    database('create')
    prefix = 'bench-leader-%s' % uuid.uuid4().hex[:8]
    env = dict(os.environ, AIJOB_DATABASE_URL=DATABASE_URL, AIJOB_REDIS_URL=REDIS_URL)
    env['AIJOB_REDIS_PREFIX'] = prefix
    subprocess.run([sys.executable, 'aijob.py', 'initdb'], cwd=ROOT, env=env, check=True)
    procs = []
    try:
        for i in range(workers):
            log_path = folder / ('%s-%d.log' % (prefix, i))
            log = open(log_path, 'wb')
            proc = subprocess.Popen(
                [sys.executable, 'aijob.py', 'worker'], cwd=ROOT, env=env, stdout=log, stderr=log
            )
            procs.append((proc, log, log_path))
            deadline = time.monotonic() + 60
            while not log_events(log_path, 'worker.started') and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(seconds)
        for proc, _, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log, _ in procs:
            proc.wait(60)
            log.close()
        rates = {'leader': None, 'followers': []}
        for _, _, log_path in procs:
            started = log_events(log_path, 'worker.started')[0]
            stopped = log_events(log_path, 'worker.stopped')[0]
            rate = stopped['statements'] / seconds
            if started['leader']:
                rates['leader'] = rate
            else:
                rates['followers'].append(rate)
        return rates
    finally:
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=prefix + '*', count=1000))
        if keys:
            client.delete(*keys)
        database('drop')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workers', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=60.0)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args()
    leader, follower, ratio = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for number in range(1, args.rounds + 1):
            rates = one_round(pathlib.Path(folder), args.workers, args.seconds)
            total = rates['leader'] + sum(rates['followers'])
            everyone_leads = rates['leader'] * args.workers
            leader.append(rates['leader'])
            follower.append(statistics.median(rates['followers']))
            ratio.append(total / everyone_leads)
            print(
                'round %d: leader %.2f statements/s, followers %s, total %.2f/s '
                '(%.2f of every process leading)'
                % (
                    number,
                    rates['leader'],
                    ', '.join('%.2f' % r for r in rates['followers']),
                    total,
                    ratio[-1],
                )
            )
    print(
        'median over %d rounds, %d idle workers, %.0f s: leader %.2f statements/s, follower '
        '%.2f/s; all together %.2f of what %d leaders would send'
        % (
            args.rounds,
            args.workers,
            args.seconds,
            statistics.median(leader),
            statistics.median(follower),
            statistics.median(ratio),
            args.workers,
        )
    )


if __name__ == '__main__':
    main()
