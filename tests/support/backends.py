"""The backend pairs every test runs against (docs/architecture.md, "Tests").

``sqlite+memory`` always runs. ``mysql+redis`` (and, where a test module asks for it,
``mysql-features+redis``) runs against AIJOB_TEST_MYSQL_URL /
AIJOB_TEST_REDIS_URL (default: the local servers); a missing server skips those cases locally and
fails them under CI (``CI=true``). Tests never flush a whole Redis: each run has its own prefix.
Under pytest-xdist each worker uses a database of its own, AIJOB_TEST_MYSQL_URL's name with the
worker's id appended (``test_gw0``, ``test_gw1``...), created if missing, so that workers never
empty each other's tables.
"""

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pymysql
import pytest
import redis

from engine.extensions import load_config

WORKER = os.environ.get('PYTEST_XDIST_WORKER', '')  # 'gw0', 'gw1'... under xdist, else ''


def worker_url(url):
    """``url`` with this xdist worker's id appended to its database name (unchanged without
    xdist)."""
    if not WORKER:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path='/%s_%s' % (parts.path.strip('/'), WORKER)))


MYSQL_URL = worker_url(os.environ.get('AIJOB_TEST_MYSQL_URL', 'mysql://root@127.0.0.1:3306/test'))
REDIS_URL = os.environ.get('AIJOB_TEST_REDIS_URL', 'redis://127.0.0.1:6379/0')
IN_CI = os.environ.get('CI', '').lower() in ('1', 'true', 'yes')
RUN_PREFIX = 'aijob-test-%s' % uuid.uuid4().hex[:8]
BACKENDS = ('sqlite+memory', 'mysql+redis')
# MariaDB with MySQL's feature set (the URL's ?features=mysql: no RETURNING, no anonymous blocks,
# no CHECK), so MySQL's branch of the hot path runs too. Only tests marked ``all_dialects`` (the
# tests of the SQL branches) take it, besides the two pairs.
MYSQL_FEATURES = 'mysql-features+redis'
ALL_DIALECTS = BACKENDS + (MYSQL_FEATURES,)

_server_status = {}


def _mysql_problem():
    """None if the test MySQL answers (creating its database if needed), else why not."""
    parts = urlsplit(MYSQL_URL)
    try:
        conn = pymysql.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or 'root',
            password=parts.password or '',
            connect_timeout=3,
        )
        with conn.cursor() as cursor:
            cursor.execute(
                'CREATE DATABASE IF NOT EXISTS `%s` CHARACTER SET utf8mb4' % parts.path.strip('/')
            )
        conn.close()
        return None
    except pymysql.MySQLError as exc:
        return 'MySQL at %s unreachable: %s' % (MYSQL_URL, exc)


def _redis_problem():
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
        return None
    except redis.RedisError as exc:
        return 'Redis at %s unreachable: %s' % (REDIS_URL, exc)


def require_servers(*names):
    """Skip (locally) or fail (under CI) unless the named servers answer."""
    checks = {'mysql': _mysql_problem, 'redis': _redis_problem}
    for name in names:
        if name not in _server_status:
            _server_status[name] = checks[name]()
        problem = _server_status[name]
        if problem:
            if IN_CI:
                pytest.fail('CI requires the test servers: ' + problem)
            pytest.skip(problem)


class Backend:
    def __init__(self, name, database_url, redis_url):
        self.name, self.database_url, self.redis_url = name, database_url, redis_url
        self.prefix = '%s-%s' % (RUN_PREFIX, uuid.uuid4().hex[:6])  # this test's Redis keys

    def env(self, **extra):
        """Environment (raw strings) for a Config or a child process on this backend."""
        env = {
            'AIJOB_DATABASE_URL': self.database_url,
            'AIJOB_REDIS_URL': self.redis_url or '',
            'AIJOB_REDIS_PREFIX': self.prefix,
        }
        env.update(extra)
        return env

    def config(self, **extra):
        return load_config(self.env(**extra))

    def __repr__(self):
        return self.name


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'all_dialects: the test runs on mysql-features+redis too (its backend pairs)'
    )


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    """A test marked ``all_dialects`` that takes ``backend`` runs on ALL_DIALECTS, unless it
    names its own pairs (a parametrize of ``backend``, which wins)."""
    definition = metafunc.definition
    if definition.get_closest_marker('all_dialects') is None:
        return
    if 'backend' not in metafunc.fixturenames:
        return
    if any(mark.args[0] == 'backend' for mark in definition.iter_markers('parametrize')):
        return
    definition.add_marker(pytest.mark.parametrize('backend', ALL_DIALECTS, indirect=True))


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    if request.param == 'sqlite+memory':
        yield Backend(request.param, 'sqlite:///%s' % (tmp_path / 'aijob.db'), None)
        return
    require_servers('mysql', 'redis')
    url = MYSQL_URL + '?features=mysql' if request.param == MYSQL_FEATURES else MYSQL_URL
    chosen = Backend(request.param, url, REDIS_URL)
    yield chosen
    delete_redis_keys(chosen.prefix)


def delete_redis_keys(prefix, url=REDIS_URL):
    """Remove one test's keys (never a whole FLUSHDB: other runs may share the server)."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=prefix + ':*', count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def reset_tables(runtime):
    """Empty every table of ``runtime``: the kernel's, the installed features', the plugins'
    (MySQL keeps its schema between tests; SQLite is a new file)."""
    with runtime.store.connection():
        for model in runtime.models:
            model.delete().execute()
