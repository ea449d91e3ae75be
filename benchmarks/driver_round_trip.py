"""What a create's round trip costs the client with each MySQL driver (issue 23): would a C
driver cut the creating process's CPU?

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_driver \
        python benchmarks/driver_round_trip.py [--creates 1500] [--rounds 4]

On the database the URL names (its tables are created if missing; use a database of its own):
one real create goes through ``AiJobService`` and the exact multi-statement text it sends is
kept (BEGIN, the admission upsert, the job, its snapshot, outbox event and history row, COMMIT).
That text, with a new job and user each time, is then sent ``--creates`` times per round with
pymysql (the engine's driver) and with mysqlclient (``MySQLdb``) when it is installed
(``pip install mysqlclient`` needs ``libmariadb-dev`` and a compiler; the project does not
depend on it), alternately, reading every result as the engine does. Printed per driver: the
CPU (user + system of this process) and wall time per create, each round and the median.
"""

import argparse
import os
import statistics
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pymysql  # noqa: E402
import pymysql.cursors  # noqa: E402

from engine.core.service import CreateJobInput  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

CAPTURED_USER = 'driver-bench-capture'


def captured_create(runtime):
    """The text of the query that carries a create's writes, with its job id and user id as
    {job} and {user}: the second create's, when the process has read what it checks once (the
    server's version, its constraints) and BEGIN goes with the writes."""
    sent = []
    query = pymysql.cursors.Cursor._query

    def keep(cursor, text):
        sent.append(text)
        return query(cursor, text)

    request = CreateJobInput(
        user_id=CAPTURED_USER,
        job_type='synthetic',
        target_type='bench',
        target_id='capture',
        input={'n': 1},
    )
    pymysql.cursors.Cursor._query = keep
    try:
        with runtime.store.connection():
            runtime.service.create_job(request)
            job = runtime.service.create_job(request).job
    finally:
        pymysql.cursors.Cursor._query = query
    text = [t for t in sent if 'INSERT INTO ai_job ' in t][-1]
    assert text.startswith('BEGIN;') and text.endswith('COMMIT'), 'not one round trip: %r' % text
    text = text.replace('{', '{{').replace('}', '}}')
    return text.replace(job.id, '{job}').replace(CAPTURED_USER, '{user}')


def connect(module, flags, store):
    """A connection of ``module`` with the engine's own settings for this database (read from
    its store, not from the URL again), the multi-statement flag set as the engine sets it."""
    params = store.db.connect_params
    extra = {}
    if module is pymysql and 'ssl_disabled' in params:
        extra['ssl_disabled'] = params['ssl_disabled']  # as the engine: no TLS to loopback
    return module.connect(
        host=params['host'],
        port=params['port'],
        user=params['user'],
        password=params['password'],
        database=store.db.database,
        charset=params['charset'],
        init_command=params['init_command'],
        client_flag=flags.MULTI_STATEMENTS,
        autocommit=True,
        **extra,
    )


def run(connection, text, count, tag):
    """CPU and wall µs per create over ``count`` creates on ``connection``."""
    cursor = connection.cursor()
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        cursor.execute(text.format(job=str(uuid.uuid4()), user='%s-%d' % (tag, i)))
        while True:
            if cursor.description:
                cursor.fetchall()
            if not cursor.nextset():
                break
    return (time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6


def drivers():
    from pymysql.constants import CLIENT as PYMYSQL_CLIENT

    found = [('pymysql', pymysql, PYMYSQL_CLIENT)]
    try:
        import MySQLdb
        from MySQLdb.constants import CLIENT as MYSQLDB_CLIENT
    except ImportError:
        print('mysqlclient is not installed: pymysql alone')
    else:
        found.append(('mysqlclient', MySQLdb, MYSQLDB_CLIENT))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--creates', type=int, default=1500)
    parser.add_argument('--rounds', type=int, default=4)
    args = parser.parse_args()
    config = load_config()
    if config.database_url.split(':')[0] not in ('mysql', 'mariadb'):
        sys.exit('AIJOB_DATABASE_URL must name a MariaDB/MySQL database')
    runtime = Runtime(config, role='bench')
    runtime.create_schema()
    text = captured_create(runtime)
    results = {}
    run_id = uuid.uuid4().hex[:8]
    for r in range(args.rounds):
        for name, module, flags in drivers():
            connection = connect(module, flags, runtime.store)
            run(connection, text, 100, '%s-%s-warm%d' % (run_id, name, r))
            figures = run(connection, text, args.creates, '%s-%s-%d' % (run_id, name, r))
            connection.close()
            results.setdefault(name, []).append(figures)
            print('round %d %s: cpu_us=%.0f wall_us=%.0f' % ((r + 1, name) + figures))
    runtime.close()
    for name, rounds in results.items():
        print(
            '%s: cpu_us_per_create=%.0f wall_us_per_create=%.0f (medians of %d rounds)'
            % (
                name,
                statistics.median(cpu for cpu, _ in rounds),
                statistics.median(wall for _, wall in rounds),
                len(rounds),
            )
        )


if __name__ == '__main__':
    main()
