"""What a create's admission costs as its user's history grows (issue 23): the counter upsert
(engine/core/admission.py) against the read of the user's jobs it replaced.

    python benchmarks/admission_cost.py [--history 0,1000,10000] [--creates 300] [--rounds 3]

On its own database of the local MariaDB (``bench_admission``, dropped at the end): for each
``--history``, one user given that many jobs created today (all finished but 50), then, per
round, ``--creates`` times each statement in a transaction rolled back (BEGIN, the statement,
ROLLBACK: three round trips, as a create's share of them). Printed: microseconds per create,
wall clock, medians over the rounds. The counters' cost should not grow with the history.
"""

import argparse
import os
import statistics
import sys
import time
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pymysql  # noqa: E402

from engine.core.admission import ADMIT_RETURNING  # noqa: E402
from engine.core.store import default_schema_path, split_sql  # noqa: E402

DATABASE = 'bench_admission'
USER = 'heavy-user'
UNFINISHED = 50
# The read the counters replaced, for one user: unfinished jobs and jobs created today.
REPLACED_READ = (
    "SELECT COALESCE(SUM(user_id = %s AND lifecycle_status IN ('queued', 'running')), 0), "
    'COALESCE(SUM(user_id = %s AND created_at >= UTC_DATE()), 0) FROM ai_job '
    "WHERE user_id IN (%s) AND (lifecycle_status IN ('queued', 'running') "
    'OR created_at >= UTC_DATE())'
)


def connect(url, database=None):
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or '127.0.0.1',
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
        database=database,
        autocommit=True,
    )


def give_history(cursor, jobs):
    """``jobs`` jobs of USER created today (UNFINISHED of them queued), and its counters."""
    cursor.execute('DELETE FROM ai_job')
    cursor.execute('DELETE FROM ai_user_admission')
    row = (
        "(%s, %s, 'ai-interactive', 50, 0, %s, 'synthetic', 't', 't', 'f', 'platform_key', 0, 0, "
        '0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))'
    )
    for start in range(0, jobs, 1000):
        chunk = range(start, min(jobs, start + 1000))
        params = []
        for n in chunk:
            params += ('job-%08d' % n, 'queued' if n < UNFINISHED else 'succeeded', USER)
        cursor.execute(
            'INSERT INTO ai_job (id, lifecycle_status, queue_name, priority, progress, user_id, '
            'job_type, target_type, target_id, request_fingerprint, credential_mode, attempt_no, '
            'retry_count, max_retry_count, created_at, updated_at) VALUES '
            + ', '.join([row] * len(chunk)),
            params,
        )
    cursor.execute(
        "INSERT INTO ai_user_admission VALUES (%s, %s, UTC_DATE(), %s, '')",
        (USER, min(jobs, UNFINISHED), jobs),
    )


def per_create_us(cursor, text, params, creates):
    started = time.perf_counter()
    for i in range(creates):
        cursor.execute('BEGIN')
        cursor.execute(text, params(i))
        cursor.fetchall()
        cursor.execute('ROLLBACK')
    return (time.perf_counter() - started) * 1e6 / creates


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--history', default='0,1000,10000')
    parser.add_argument('--creates', type=int, default=300)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get('AIJOB_DATABASE_URL', 'mysql://root@127.0.0.1:3306/')
    server = connect(url)
    server.cursor().execute('DROP DATABASE IF EXISTS %s' % DATABASE)
    server.cursor().execute('CREATE DATABASE %s CHARACTER SET utf8mb4' % DATABASE)
    try:
        cursor = connect(url, DATABASE).cursor()
        with open(default_schema_path(), encoding='utf-8') as schema:
            for ddl in split_sql(schema.read()):
                cursor.execute(ddl)
        limits = (0, 0, 1_000_000, 1_000_000)  # no active limit; a quota never reached
        for jobs in (int(n) for n in args.history.split(',')):
            give_history(cursor, jobs)
            read, counters = [], []
            for _ in range(args.rounds):
                read.append(
                    per_create_us(cursor, REPLACED_READ, lambda i: (USER,) * 3, args.creates)
                )
                counters.append(
                    per_create_us(
                        cursor,
                        ADMIT_RETURNING.mysql,
                        lambda i: (USER, 'new-%d' % i) + limits,
                        args.creates,
                    )
                )
            print(
                'user with %6d jobs today: replaced read %7.0f us, counters %5.0f us per create'
                % (jobs, statistics.median(read), statistics.median(counters))
            )
    finally:
        server.cursor().execute('DROP DATABASE IF EXISTS %s' % DATABASE)


if __name__ == '__main__':
    main()
