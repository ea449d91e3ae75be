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
