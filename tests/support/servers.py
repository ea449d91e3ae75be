"""Servers of a test's own, for fault tests: a MariaDB on a free port with its data in a
temporary folder, which the test may stop and start again. The shared servers are never
touched."""

import shutil
import socket
import subprocess
import time

import pymysql
import pytest


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class PrivateMariaDB:
    """``start()``/``stop()`` a mariadbd over one data folder; ``url`` names its ``test``
    database."""

    def __init__(self, folder):
        self.datadir = folder / 'data'
        self.port = free_port()
        self.process = None
        subprocess.run(
            ['mariadb-install-db', '--no-defaults', '--datadir=%s' % self.datadir, '--user=root'],
            check=True,
            capture_output=True,
        )

    @property
    def url(self):
        return 'mysql://root@127.0.0.1:%d/test' % self.port

    def start(self, timeout_s=30):
        self.process = subprocess.Popen(
            [
                'mariadbd',
                '--no-defaults',
                '--datadir=%s' % self.datadir,
                '--port=%d' % self.port,
                '--bind-address=127.0.0.1',
                '--socket=%s' % (self.datadir / 'sock'),
                '--skip-grant-tables',
                '--user=root',
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = pymysql.connect(host='127.0.0.1', port=self.port, user='root')
                break
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)
        with conn.cursor() as cursor:
            cursor.execute('CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4')
        conn.close()

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.process = None


@pytest.fixture
def private_mariadb(tmp_path):
    if not (shutil.which('mariadb-install-db') and shutil.which('mariadbd')):
        pytest.skip('no MariaDB binaries on this machine')
    server = PrivateMariaDB(tmp_path)
    server.start()
    yield server
    server.stop()


class PrivateRedis:
    """``start()``/``stop()`` a redis-server without persistence on a free port below 55536: a
    restart comes back empty, as a Redis without persistence does."""

    def __init__(self, folder):
        self.folder = folder
        self.port = free_port()
        while self.port >= 55536:
            self.port = free_port()
        self.process = None

    @property
    def url(self):
        return 'redis://127.0.0.1:%d/0' % self.port

    def start(self, timeout_s=30):
        import redis

        self.process = subprocess.Popen(
            ['redis-server', '--port', str(self.port), '--bind', '127.0.0.1']
            + ['--save', '', '--appendonly', 'no', '--dir', str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self.process = None


@pytest.fixture
def private_redis(tmp_path):
    if not shutil.which('redis-server'):
        pytest.skip('no redis-server binary on this machine')
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


class ServeProcess:
    """A real ``python aijob.py serve`` on a free port, in ``folder``, with ``env`` over the test
    process's environment. ``base`` is its URL; ``stop()`` sends SIGTERM and waits."""

    def __init__(self, folder, env, timeout_s=30):
        import os
        import sys

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.port = free_port()
        self.base = 'http://127.0.0.1:%d' % self.port
        self.log_path = folder / ('serve-%d.log' % self.port)
        self._log = open(self.log_path, 'wb')
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(root, 'aijob.py'), 'serve'],
            cwd=str(folder),
            env={**os.environ, **env, 'AIJOB_PORT': str(self.port)},
            stdout=self._log,
            stderr=self._log,
        )
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s):
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()
            try:
                with urllib.request.urlopen(self.base + '/healthz', timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError('serve did not answer within %.0fs' % timeout_s)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self._log.close()
        return self.process.returncode


@pytest.fixture
def serve_process(tmp_path):
    """``start(env)`` → a running ServeProcess; every one started is stopped at the end."""
    started = []

    def start(env):
        server = ServeProcess(tmp_path, env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
