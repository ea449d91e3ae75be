"""``python aijob.py bench`` runs end to end on both backend pairs and prints its last line with
every figure (issue 9, item 3). No timing is asserted: the figures only have to be there, parse
and be positive. The mysql+redis case uses a database (the test database's name + ``_bench``,
so one per xdist worker) and a Redis prefix of its own, so that it does not disturb the rest of
the suite."""

import os
import re
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pymysql
import pytest

from tests.support.backends import (
    MYSQL_URL,
    REDIS_URL,
    RUN_PREFIX,
    delete_redis_keys,
    require_servers,
)
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

BENCH_DATABASE = urlsplit(MYSQL_URL).path.strip('/') + '_bench'
LAST_LINE = re.compile(
    r'^e2e_jobs_per_s=(?P<e2e_jobs_per_s>\S+) '
    r'create_to_running_p50_ms=(?P<p50>\S+) create_to_running_p99_ms=(?P<p99>\S+) '
    r'commits_per_job=(?P<commits_per_job>\S+) statements_per_job=(?P<statements_per_job>\S+) '
    r'round_trips_per_job=(?P<round_trips_per_job>\S+) '
    r'cpu_ms_per_job=(?P<cpu_ms_per_job>\S+) succeeded=(?P<succeeded>\d+)/(?P<jobs>\d+)$'
)
JOBS = 20


def mysql_connection(url, database=None):
    """A plain pymysql connection to ``url``'s server (to ``database`` when given)."""
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
        database=database,
        connect_timeout=3,
        autocommit=True,
    )


def bench_mysql_url():
    """The test MySQL server, with the bench's own database (created if missing)."""
    base = urlsplit(MYSQL_URL)
    conn = mysql_connection(base.geturl())
    with conn.cursor() as cursor:
        cursor.execute('CREATE DATABASE IF NOT EXISTS `%s` CHARACTER SET utf8mb4' % BENCH_DATABASE)
    conn.close()
    return urlunsplit(base._replace(path='/' + BENCH_DATABASE))


def run_bench(env, *args):
    environ = dict(os.environ)
    environ.update(env)
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'bench', '--jobs', str(JOBS), *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    return match.groupdict(), result.stdout


def assert_figures(figures):
    assert (int(figures['succeeded']), int(figures['jobs'])) == (JOBS, JOBS)
    for name in ('e2e_jobs_per_s', 'commits_per_job', 'statements_per_job', 'cpu_ms_per_job'):
        assert float(figures[name]) > 0, (name, figures[name])
    for name in ('p50', 'p99'):
        assert float(figures[name]) >= 0, (name, figures[name])
    # a job takes at least a BEGIN, a COMMIT and a write: more statements than commits; some
    # go together in one round trip, never more than one round trip per statement
    assert float(figures['statements_per_job']) > float(figures['commits_per_job'])
    assert 0 < float(figures['round_trips_per_job']) <= float(figures['statements_per_job'])


@pytest.fixture
def mysql_redis():
    require_servers('mysql', 'redis')
    prefix = '%s-bench' % RUN_PREFIX
    yield {
        'AIJOB_DATABASE_URL': bench_mysql_url(),
        'AIJOB_REDIS_URL': REDIS_URL,
        'AIJOB_REDIS_PREFIX': prefix,
    }
    delete_redis_keys(prefix)


def sqlite_env(tmp_path):
    return {'AIJOB_DATABASE_URL': 'sqlite:///%s' % (tmp_path / 'b.db'), 'AIJOB_REDIS_URL': ''}


def test_bench_on_the_embedded_default(tmp_path):
    figures, _ = run_bench(sqlite_env(tmp_path))
    assert_figures(figures)


def test_bench_with_concurrency_and_sleeping_jobs_on_the_embedded_default(tmp_path):
    figures, out = run_bench(sqlite_env(tmp_path), '--concurrency', '4', '--sleep-ms', '20')
    assert_figures(figures)
    assert 'interactive_concurrency: 4' in out
    assert "job_input: {'sleepMs': 20}" in out


def test_bench_with_jobs_spread_over_a_few_users_on_the_embedded_default(tmp_path):
    """``--users 3``: the jobs go to 3 users, in turn."""
    figures, out = run_bench(sqlite_env(tmp_path), '--users', '3')
    assert_figures(figures)
    assert re.search(r'^users: 3$', out, re.M), out


def test_bench_on_mysql_and_redis(mysql_redis):
    figures, out = run_bench(mysql_redis)
    assert_figures(figures)
    assert 'backends: mysql + redis' in out
    # the worker ran in its own process, and reported its share
    assert re.search(r'^worker_statements_per_job: [1-9]', out, re.M), out
    assert re.search(r'^worker_cpu_ms_per_job: \d', out, re.M), out


def test_bench_with_concurrency_and_sleeping_jobs_on_mysql_and_redis(mysql_redis):
    figures, out = run_bench(mysql_redis, '--concurrency', '4', '--sleep-ms', '20')
    assert_figures(figures)
    assert 'interactive_concurrency: 4' in out
    assert 'worker: process' in out and '4 interactive threads' in out


def test_a_bench_told_to_stop_stops_its_worker_process(mysql_redis):
    """SIGTERM to the bench (a benchmark script timing out, an operator's kill) while it
    creates jobs: it exits, its creating threads and its worker process with it, so no orphan
    takes a share of the next bench's jobs and no job is created after it."""
    environ = dict(os.environ, **mysql_redis)
    jobs_before = count_jobs(mysql_redis)
    bench = subprocess.Popen(
        [sys.executable, 'aijob.py', 'bench', '--jobs', '100000', '--rate', '20'],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    worker_pid, orphaned = None, False
    try:
        line = ''
        while not line.startswith('worker: process'):
            line = bench.stdout.readline()
            assert line, 'the bench ended before its worker started'
        worker_pid = int(line.split()[2].rstrip(','))
        deadline = time.monotonic() + 30
        while count_jobs(mysql_redis) <= jobs_before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count_jobs(mysql_redis) > jobs_before + 2, 'the bench never began creating'
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
        created = count_jobs(mysql_redis)
        time.sleep(0.5)  # 10 more jobs at 20/s, had a creating thread outlived the bench
        assert count_jobs(mysql_redis) == created
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)
        if worker_pid is not None:  # however the test ends, no worker outlives it
            deadline = time.monotonic() + 10
            while is_running(worker_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            orphaned = is_running(worker_pid)
            if orphaned:
                os.kill(worker_pid, signal.SIGKILL)
    assert not orphaned


def count_jobs(env):
    """Jobs in the bench's database (0 before its first run made the table)."""
    url = env['AIJOB_DATABASE_URL']
    conn = mysql_connection(url, database=urlsplit(url).path.lstrip('/'))
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                'SELECT COUNT(*) FROM information_schema.TABLES '
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'ai_job'"
            )
            if not cursor.fetchone()[0]:
                return 0
            cursor.execute('SELECT COUNT(*) FROM ai_job')
            return cursor.fetchone()[0]
    finally:
        conn.close()


def is_running(pid):
    """Is process ``pid`` alive (a zombie, dead but not yet reaped, counts as gone)?"""
    try:
        with open('/proc/%d/stat' % pid) as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False
