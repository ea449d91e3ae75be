"""Growth (issue 9, item 6): the same figures on an empty table and with 1 000 000 finished jobs.

On its own MariaDB database (dropped and created: ``--database-url``, default
``mysql://root@127.0.0.1:3306/test_growth``) and Redis db (``--redis-url``, default db 6):

1. the schema, then the empty-table figures: ``python aijob.py bench --jobs N`` as a child
   (``e2e_jobs_per_s``, median of ``--repeat`` runs), a status GET (``--gets`` in-process calls
   of the WSGI app, ``engine.http.app.create_app``; p50 and mean), and the admin list's first page
   and a deep page (nextCursor followed ``--deep-pages`` pages, or as far as there are pages),
   unfiltered and with every filter the API allows;
2. ``--rows`` finished jobs (default 1 000 000) with their snapshots, published outbox events,
   artifacts (ai_artifact + ai_job_artifact) and history rows (ai_job_event: created,
   dispatched, started when it ran, and its end), written by INSERT … SELECT from the sequence
   engine (``seq_1_to_N``): 200 users (skewed), two job types, both queues, succeeded / failed /
   cancelled, created over the past 28 days with UUIDv7-like ids that increase with created_at;
3. ANALYZE TABLE, the same figures again, then both sets and the ratios; last, one purger sweep
   at the default retention settings, timed, and what it left.

The bench children run with AIJOB_OUTBOX_RETENTION_MS and AIJOB_HISTORY_RETENTION_MS at 60 days,
so the purger (which sweeps
as the worker starts) deletes nothing during a measured run: the "after" figures are with every
row still present.

    python benchmarks/growth.py [--rows 1000000] [--jobs 3000] [--repeat 2]
"""

import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pymysql  # noqa: E402

from engine.core.models import AiJob  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.http import params as admin_params  # noqa: E402
from engine.http.app import create_app  # noqa: E402
from engine.http.auth import TokenStore  # noqa: E402
from engine.runtime import Runtime  # noqa: E402
from tests.support.wsgi import WsgiClient  # noqa: E402

DAYS = 28
USERS = 200
HEAVY_USER = 'user-000'  # ~7% of the filled jobs (the users are skewed)
CHUNK = 100_000
RETENTION_DURING_BENCH_MS = str(60 * 24 * 3600 * 1000)
TABLES = (
    'ai_job',
    'ai_job_snapshot',
    'outbox_event',
    'ai_artifact',
    'ai_job_artifact',
    'ai_job_event',
)


def connect(url):
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or '127.0.0.1',
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
        autocommit=True,
    )


def recreate_database(url):
    name = urlsplit(url).path.lstrip('/')
    conn = connect(url)
    with conn.cursor() as cur:
        cur.execute('DROP DATABASE IF EXISTS `%s`' % name)
        cur.execute('CREATE DATABASE `%s` CHARACTER SET utf8mb4' % name)
    conn.close()


def flush_redis(url):
    import redis

    redis.Redis.from_url(url).flushdb()


# ---------------------------------------------------------------- the fill
# One job per sequence value: created_at every DAYS*86400000/rows ms from DAYS ago, the id a
# UUIDv7 of that millisecond (hex time, then an MD5 tail), so ids increase with created_at.
JOB_FILL = """
INSERT INTO ai_job (id, lifecycle_status, queue_name, priority, progress, user_id, job_type,
  target_type, target_id, idempotency_key, request_fingerprint, credential_mode, credential_id,
  prompt_version, output_schema_version, locked_by, locked_at, lock_until, attempt_no,
  retry_count, max_retry_count, cancel_requested_at, started_at, finished_at, error_code,
  public_error_message, internal_error_message, output_hash, retry_of_job_id, created_at,
  updated_at)
SELECT
  LOWER(CONCAT(SUBSTR(h, 1, 8), '-', SUBSTR(h, 9, 4), '-7', SUBSTR(m, 1, 3), '-',
               SUBSTR('89ab', 1 + seq %% 4, 1), SUBSTR(m, 4, 3), '-', SUBSTR(m, 7, 12))),
  status, IF(job_type = 'synthetic', 'ai-interactive', 'ai-background'),
  IF(job_type = 'synthetic', 50, 40), IF(status = 'succeeded', 100, 30),
  CONCAT('user-', LPAD(FLOOR(POW(RAND(seq), 2) * %(users)d), 3, '0')), job_type,
  'note', CONCAT('note-', seq), IF(seq %% 3 = 0, CONCAT('key-', seq), NULL), SHA2(seq, 256),
  'platform_key', NULL, IF(job_type = 'synthetic', NULL, 'v1'),
  IF(job_type = 'synthetic', NULL, 'v1'), 'worker-1', started, NULL, 1, 0, 2,
  IF(status = 'cancelled', created, NULL), IF(status = 'cancelled', NULL, started), finished,
  IF(status = 'failed', 'PROVIDER_UNAVAILABLE', NULL),
  IF(status = 'failed', 'The AI provider is unavailable.', NULL),
  IF(status = 'failed', 'upstream 500 from provider.example', NULL),
  IF(status = 'succeeded', SHA2(CONCAT('out', seq), 256), NULL), NULL, created, finished
FROM (
  SELECT seq, LPAD(HEX(ms), 12, '0') AS h, MD5(seq) AS m,
         FROM_UNIXTIME(ms / 1000) AS created,
         FROM_UNIXTIME((ms + 4) / 1000) AS started,
         FROM_UNIXTIME((ms + 40 + seq %% 200) / 1000) AS finished,
         CASE WHEN seq %% 100 < 90 THEN 'succeeded' WHEN seq %% 100 < 97 THEN 'failed'
              ELSE 'cancelled' END AS status,
         IF(seq %% 10 < 7, 'synthetic', 'flashcard_generation') AS job_type
  FROM (SELECT seq, %(start_ms)d + seq * %(step_ms)d AS ms
        FROM seq_1_to_%(rows)d WHERE seq BETWEEN %(lo)d AND %(hi)d) t
) s
ORDER BY seq
"""

SNAPSHOT_FILL = """
INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at, created_at)
SELECT id, CONCAT('{"input":{"text":"', REPEAT('lorem ipsum ', 12), '","n":"', target_id,
                  '"},"overrides":{}}'),
       1, created_at + INTERVAL 30 DAY, created_at
FROM ai_job WHERE id BETWEEN %(lo)s AND %(hi)s AND target_type = 'note' ORDER BY id
"""

OUTBOX_FILL = """
INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload, status,
  attempt_count, available_at, locked_by, locked_at, last_error, created_at, updated_at)
SELECT 'ai.job.enqueue', 'AiJob', id,
       CONCAT(job_type, ':', user_id, ':', COALESCE(idempotency_key, id)),
       CONCAT('{"jobId":"', id, '","jobType":"', job_type, '","queueName":"', queue_name,
              '","priority":', priority, '}'),
       'published', 1, created_at, 'web-1', created_at, NULL, created_at,
       created_at + INTERVAL 2000 MICROSECOND
FROM ai_job WHERE id BETWEEN %(lo)s AND %(hi)s AND target_type = 'note' ORDER BY id
"""

# The artifact id as projectors.artifact_id makes it: the job id's time prefix, then a hash.
ARTIFACT_FILL = """
INSERT INTO ai_artifact (id, job_id, artifact_type, content, content_hash, created_at)
SELECT CONCAT(SUBSTR(id, 1, 15), SUBSTR(a, 1, 3), '-8', SUBSTR(a, 4, 3), '-', SUBSTR(a, 7, 12)),
       id, IF(job_type = 'synthetic', 'synthetic_result', 'flashcard_set'),
       CONCAT('{"cards":[{"front":"', REPEAT('q', 60), '","back":"', REPEAT('a', 120), '"}]}'),
       SHA2(a, 256), finished_at
FROM (SELECT id, job_type, finished_at, MD5(CONCAT(id, ':a:0')) AS a FROM ai_job
      WHERE id BETWEEN %(lo)s AND %(hi)s AND target_type = 'note'
        AND lifecycle_status = 'succeeded') j
ORDER BY id
"""

LINK_FILL = """
INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal, created_at)
SELECT job_id, artifact_type, id, 0, created_at FROM ai_artifact
WHERE job_id BETWEEN %(lo)s AND %(hi)s ORDER BY job_id
"""

# What the lifecycle writes for a finished job: created and dispatched at creation, started when
# it was locked (a job cancelled while queued never was), then its terminal row.
HISTORY_FILL = """
INSERT INTO ai_job_event (job_id, kind, attempt_no, detail, created_at)
SELECT j.id, IF(k.n = 3, j.lifecycle_status, k.kind), IF(k.n < 2, 0, 1),
       CONCAT('{"queue":"', j.queue_name, '","priority":', j.priority, '}'),
       CASE k.n WHEN 2 THEN j.started_at WHEN 3 THEN j.finished_at ELSE j.created_at END
FROM ai_job j
JOIN (SELECT 0 AS n, 'created' AS kind UNION ALL SELECT 1, 'dispatched'
      UNION ALL SELECT 2, 'started' UNION ALL SELECT 3, 'end') k
WHERE j.id BETWEEN %(lo)s AND %(hi)s AND j.target_type = 'note'
  AND (k.n <> 2 OR j.started_at IS NOT NULL)
ORDER BY j.id, k.n
"""


def fill(url, rows):
    conn = connect(url)
    db = urlsplit(url).path.lstrip('/')
    started = time.monotonic()
    with conn.cursor() as cur:
        cur.execute('USE `%s`' % db)
        cur.execute("SET time_zone = '+00:00'")
        cur.execute('SELECT FLOOR(UNIX_TIMESTAMP(UTC_TIMESTAMP(6)) * 1000)')
        now_ms = int(cur.fetchone()[0])
        span_ms = DAYS * 86_400_000
        step_ms = span_ms // rows
        start_ms = now_ms - span_ms - 3_600_000  # the newest an hour ago
        for lo in range(1, rows + 1, CHUNK):
            hi = min(rows, lo + CHUNK - 1)
            cur.execute(
                JOB_FILL
                % dict(start_ms=start_ms, step_ms=step_ms, rows=rows, lo=lo, hi=hi, users=USERS)
            )
        print('  ai_job: %d rows, %.1fs' % (rows, time.monotonic() - started), flush=True)
        # id ranges (inclusive) of the filled jobs for the dependent tables, CHUNK jobs each;
        # the bench's own jobs (newer, so greater ids) already have theirs
        cur.execute("SELECT id FROM ai_job WHERE target_type = 'note' ORDER BY id")
        ids = [row[0] for row in cur.fetchall()]
        ranges = [(ids[i], ids[min(i + CHUNK, len(ids)) - 1]) for i in range(0, len(ids), CHUNK)]
        for name, statement in (
            ('ai_job_snapshot', SNAPSHOT_FILL),
            ('outbox_event', OUTBOX_FILL),
            ('ai_artifact', ARTIFACT_FILL),
            ('ai_job_artifact', LINK_FILL),
            ('ai_job_event', HISTORY_FILL),
        ):
            t0 = time.monotonic()
            for lo, hi in ranges:
                cur.execute(statement, {'lo': lo, 'hi': hi})
            print('  %s: %.1fs' % (name, time.monotonic() - t0), flush=True)
        t0 = time.monotonic()
        for table in TABLES:
            cur.execute('ANALYZE TABLE `%s`' % table)
            cur.fetchall()
        print('  ANALYZE TABLE: %.1fs' % (time.monotonic() - t0), flush=True)
    conn.close()
    return time.monotonic() - started


def table_sizes(url):
    conn = connect(url)
    db = urlsplit(url).path.lstrip('/')
    sizes = {}
    with conn.cursor() as cur:
        for table in TABLES:
            cur.execute('SELECT COUNT(*) FROM `%s`.`%s`' % (db, table))
            sizes[table] = cur.fetchone()[0]
    conn.close()
    return sizes


# ---------------------------------------------------------------- the figures
def snapshot_code():
    """A copy of aijob.py, schema.sql and engine/ as they are now: other people edit the working
    tree, and the before and after runs must run the same code."""
    target = tempfile.mkdtemp(prefix='aijob-growth-')
    for name in ('aijob.py', 'schema.sql'):
        shutil.copy(os.path.join(ROOT, name), target)
    shutil.copytree(
        os.path.join(ROOT, 'engine'),
        os.path.join(target, 'engine'),
        ignore=shutil.ignore_patterns('__pycache__'),
    )
    return target


def run_bench(env, jobs, code):
    out = subprocess.run(
        [sys.executable, os.path.join(code, 'aijob.py'), 'bench', '--jobs', str(jobs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    match = re.search(r'e2e_jobs_per_s=([0-9.]+)', out.stdout)
    if out.returncode != 0 or not match:
        raise SystemExit('bench failed:\n%s\n%s' % (out.stdout[-3000:], out.stderr[-3000:]))
    last = [line for line in out.stdout.splitlines() if 'e2e_jobs_per_s=' in line][-1]
    print('  bench: ' + last, flush=True)
    return float(match.group(1))


def timed(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    times.sort()
    return {'p50': statistics.median(times), 'mean': statistics.fmean(times), 'max': times[-1]}


def admin_filters(sample):
    """Every filter the API allows, alone and in some combinations, with values from the data."""
    week_ago = sample['newest'] - 7 * 86_400
    day = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(week_ago))
    day_end = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(week_ago + 86_400))
    return {
        'none': {},
        'jobType': {'jobType': 'flashcard_generation'},
        'lifecycleStatus': {'lifecycleStatus': 'failed'},
        'lifecycleStatus=2': {'lifecycleStatus': 'failed,cancelled'},
        'lifecycleStatus=queued': {'lifecycleStatus': 'queued'},
        'lifecycleStatus=active': {'lifecycleStatus': 'queued,running'},
        'queueName': {'queueName': 'ai-background'},
        'userId': {'userId': sample['user']},
        'createdFrom': {'createdFrom': day},
        'createdTo': {'createdTo': day},
        'createdFrom+To': {'createdFrom': day, 'createdTo': day_end},
        'userId+jobType': {'userId': sample['user'], 'jobType': 'flashcard_generation'},
        'userId+status': {'userId': sample['user'], 'lifecycleStatus': 'cancelled'},
        'jobType+status+range': {
            'jobType': 'synthetic',
            'lifecycleStatus': 'failed',
            'createdFrom': day,
            'createdTo': day_end,
        },
        'jobType+queueName(disjoint)': {'jobType': 'synthetic', 'queueName': 'ai-background'},
        'userId+queueName+range': {
            'userId': sample['user'],
            'queueName': 'ai-interactive',
            'createdTo': day,
        },
    }


def measure(config, gets, deep_pages):
    """(status GET timings, {filter: (first ms, deep ms, deep page no)})."""
    runtime = Runtime(config, role='growth')
    app = create_app(runtime)
    with runtime.store.connection():
        token = TokenStore(runtime.store).create('growth-admin', admin=True)
        newest = (
            AiJob.select(AiJob.id, AiJob.user_id, AiJob.created_at)
            .where(AiJob.lifecycle_status == 'succeeded')
            .order_by(AiJob.id.desc())
            .first()
        )
    client = WsgiClient(app, token)
    path = '/api/ai/jobs/' + newest.id

    def get():
        response = client.get(path)
        assert response.status == 200, response

    for _ in range(50):
        get()
    status = timed(get, gets)
    if deep_pages is None:  # the status GET only
        runtime.close()
        return status, {}
    sample = {
        'user': HEAVY_USER,
        'newest': _utc_seconds(newest.created_at),
    }
    pages = {}
    for name, query in admin_filters(sample).items():
        pages[name] = admin_pages(client, query, deep_pages)
    # pages at a given age, by a cursor built for it (any job of that time will do)
    for days in (5, DAYS // 2):
        with runtime.store.connection():
            at = (
                AiJob.select(AiJob.id, AiJob.created_at)
                .where(AiJob.created_at < newest.created_at - datetime.timedelta(days=days))
                .order_by(AiJob.created_at.desc(), AiJob.id.desc())
                .first()
            )
        if at is None:
            continue
        if hasattr(admin_params, 'cursor_for'):
            cursor = admin_params.cursor_for(at)
        else:  # the v1 cursor: the last id seen
            cursor = admin_params.encode_cursor(at.id)
        for name in ('none', 'jobType', 'queueName', 'userId', 'lifecycleStatus=2'):
            query = admin_filters(sample)[name]
            pages['%s@%dd' % (name, days)] = admin_pages(client, query, 0, cursor=cursor)
    runtime.close()
    return status, pages


def _utc_seconds(naive_utc):
    import calendar

    return calendar.timegm(naive_utc.timetuple())


def admin_pages(client, query, deep_pages, repeat=5, cursor=None):
    """(first page ms, deep page ms, depth): medians of ``repeat``; the deep page is the one
    ``deep_pages`` nextCursors on (or the last), or the page at ``cursor`` when given."""

    def page(cursor=None):
        q = dict(query, limit='20')
        if cursor:
            q['cursor'] = cursor
        t0 = time.perf_counter()
        response = client.get('/admin-api/ai/jobs', query=q)
        elapsed = (time.perf_counter() - t0) * 1000.0
        assert response.status == 200, response
        return elapsed, response.json['nextCursor']

    firsts = [page()[0] for _ in range(repeat)]
    if cursor is not None:
        return (
            statistics.median(firsts),
            statistics.median(page(cursor)[0] for _ in range(repeat)),
            0,
        )
    depth, before_last = 0, None
    while depth < deep_pages:
        depth += 1
        _, next_cursor = page(cursor)
        if next_cursor is None:
            break
        before_last, cursor = cursor, next_cursor
    deep_cursor = cursor if cursor is not None else before_last
    deeps = [page(deep_cursor)[0] for _ in range(repeat)]
    return statistics.median(firsts), statistics.median(deeps), depth


def figures(env, config, args, label):
    print('%s:' % label, flush=True)
    bursts = [run_bench(env, args.jobs, args.code) for _ in range(args.repeat)]
    status, pages = measure(config, args.gets, args.deep_pages)
    print(
        '  status GET: p50 %.3f ms, mean %.3f ms (%d calls)'
        % (status['p50'], status['mean'], args.gets)
    )
    for name, (first, deep, depth) in pages.items():
        print('  admin list %-24s first %6.2f ms  page %3d %6.2f ms' % (name, first, depth, deep))
    return {'burst': statistics.median(bursts), 'bursts': bursts, 'status': status, 'pages': pages}


def purge_once(config):
    """One purger sweep at the default retention settings (what a deployment runs hourly)."""
    runtime = Runtime(config, role='growth-purge')
    t0 = time.monotonic()
    with runtime.store.connection():
        counts = runtime.purger.sweep()
    elapsed = time.monotonic() - t0
    runtime.close()
    return counts, elapsed


def alternate(args):
    """The burst on an empty database and on the filled one, in turns (the machine's load from
    others drifts: neighbouring runs compare fairly); the empty one is made anew every turn."""
    empty_url = args.database_url + '_empty'
    base = dict(os.environ, AIJOB_REDIS_URL=args.redis_url)
    base['AIJOB_OUTBOX_RETENTION_MS'] = RETENTION_DURING_BENCH_MS
    base['AIJOB_HISTORY_RETENTION_MS'] = RETENTION_DURING_BENCH_MS
    ratios, gets = [], {'empty': [], 'filled': []}
    for pair in range(args.ab):
        recreate_database(empty_url)
        flush_redis(args.redis_url)
        empty = run_bench(dict(base, AIJOB_DATABASE_URL=empty_url), args.jobs, args.code)
        flush_redis(args.redis_url)
        full = run_bench(dict(base, AIJOB_DATABASE_URL=args.database_url), args.jobs, args.code)
        ratios.append(full / empty)
        print('pair %d: empty %.1f, filled %.1f, ratio %.3f' % (pair + 1, empty, full, ratios[-1]))
        for name, url in (
            ('empty', empty_url),
            ('filled', args.database_url),
            ('empty', empty_url),
        ):
            config = load_config(dict(base, AIJOB_DATABASE_URL=url))
            gets[name].append(measure(config, args.gets, None)[0]['p50'])
        print(
            '  status GET p50: empty %s ms, filled %s ms'
            % ([round(v, 3) for v in gets['empty'][-2:]], round(gets['filled'][-1], 3)),
            flush=True,
        )
    recreate_database(empty_url)
    empty_p50, filled_p50 = statistics.median(gets['empty']), statistics.median(gets['filled'])
    print(
        'status_get_p50_empty_ms=%.3f status_get_p50_filled_ms=%.3f ratio=%.3f'
        % (empty_p50, filled_p50, filled_p50 / empty_p50)
    )
    print(
        'burst_ratio_median=%.3f over %d pairs %s'
        % (statistics.median(ratios), len(ratios), [round(r, 3) for r in ratios])
    )
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--database-url', default='mysql://root@127.0.0.1:3306/test_growth')
    parser.add_argument('--redis-url', default='redis://127.0.0.1:6379/6')
    parser.add_argument('--rows', type=int, default=1_000_000)
    parser.add_argument('--jobs', type=int, default=3000)
    parser.add_argument('--repeat', type=int, default=2)
    parser.add_argument('--gets', type=int, default=500)
    parser.add_argument('--deep-pages', type=int, default=500)
    parser.add_argument('--no-purge', action='store_true', help='skip the final purger sweep')
    parser.add_argument(
        '--ab',
        type=int,
        default=0,
        metavar='PAIRS',
        help='only the burst, alternating PAIRS times between a new empty database (the '
        'database name + _empty) and the filled one as it is; prints the median ratio',
    )
    parser.add_argument(
        '--admin-only',
        action='store_true',
        help='only the status GET and admin list figures, on the database as it is (no drop, '
        'no fill, no bench)',
    )
    args = parser.parse_args(argv)
    args.code = snapshot_code()
    print('bench code: a copy of the working tree in %s' % args.code, flush=True)
    try:
        return run(args)
    finally:
        shutil.rmtree(args.code, ignore_errors=True)


def run(args):
    if args.ab:
        return alternate(args)
    if args.admin_only:
        env = dict(os.environ, AIJOB_DATABASE_URL=args.database_url, AIJOB_REDIS_URL=args.redis_url)
        status, pages = measure(load_config(env), args.gets, args.deep_pages)
        print('status GET: p50 %.3f ms, mean %.3f ms' % (status['p50'], status['mean']))
        for name, (first, deep, depth) in pages.items():
            print('admin list %-28s first %6.2f ms  page %3d %6.2f ms' % (name, first, depth, deep))
        return 0

    env = dict(os.environ)
    env.update(
        AIJOB_DATABASE_URL=args.database_url,
        AIJOB_REDIS_URL=args.redis_url,
        AIJOB_OUTBOX_RETENTION_MS=RETENTION_DURING_BENCH_MS,
        AIJOB_HISTORY_RETENTION_MS=RETENTION_DURING_BENCH_MS,
    )
    config = load_config(env)
    recreate_database(args.database_url)
    flush_redis(args.redis_url)
    runtime = Runtime(config, role='growth')
    runtime.create_schema()
    runtime.close()

    before = figures(env, config, args, 'empty table')
    print('filling %d finished jobs:' % args.rows, flush=True)
    fill_s = fill(args.database_url, args.rows)
    print('  fill: %.1fs, rows: %s' % (fill_s, table_sizes(args.database_url)), flush=True)
    after = figures(env, config, args, 'with %d finished jobs' % args.rows)

    print()
    print(
        'burst_before=%.1f burst_after=%.1f burst_ratio=%.3f (medians of %d; before %s, after %s)'
        % (
            before['burst'],
            after['burst'],
            after['burst'] / before['burst'],
            args.repeat,
            before['bursts'],
            after['bursts'],
        )
    )
    print(
        'status_get_p50_before_ms=%.3f status_get_p50_after_ms=%.3f status_get_ratio=%.3f'
        % (
            before['status']['p50'],
            after['status']['p50'],
            after['status']['p50'] / before['status']['p50'],
        )
    )
    worst = max(max(first, deep) for first, deep, _ in after['pages'].values())
    for name in after['pages']:
        b, a = before['pages'].get(name, (0.0, 0.0, 0)), after['pages'][name]
        print(
            'admin %-28s first_ms %6.2f -> %6.2f  deep_ms %6.2f (page %d) -> %6.2f (page %d)'
            % (name, b[0], a[0], b[1], b[2], a[1], a[2])
        )
    print('admin_worst_after_ms=%.2f (target < 50)' % worst)
    if not args.no_purge:
        default = load_config(dict(env, AIJOB_OUTBOX_RETENTION_MS=str(7 * 86_400_000)))
        counts, elapsed = purge_once(default)
        print(
            'purge at the default retention: %s in %.1fs; rows now %s'
            % (counts, elapsed, table_sizes(args.database_url))
        )
    return 0


if __name__ == '__main__':
    sys.exit(main())
