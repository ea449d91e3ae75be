"""Servers of a test's own, for fault tests: a MariaDB on a free port with its data in a
temporary folder, which the test may stop and start again. The shared servers are never
touched."""

import json
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pymysql
import pytest

from tests.support.backends import WORKER
from tests.support.wsgi import Response

PORT_BASE, PORT_BLOCK = 10000, 500
_next_port = []  # this process's last pick, so that it never hands out the same port twice


def free_port():
    """A loopback port nobody listens on, for a server the test starts. Each process (an xdist
    worker: gw0, gw1...) picks from a block of its own below the kernel's ephemeral range (32768
    and up): two workers never pick the same port, and no outgoing connection can take it
    between the pick and the server's bind, as one could with a port the kernel lent for
    ``bind(0)``. Up to 20 workers: a cluster node's bus port (its port + 10000) then lands in
    20000..29999, above every worker's block and below the ephemeral range."""
    block = PORT_BASE + _worker_index() * PORT_BLOCK
    if not _next_port:
        _next_port.append(random.randrange(PORT_BLOCK))  # plain runs (no xdist) share block 0
    for _ in range(PORT_BLOCK):
        _next_port[0] = (_next_port[0] + 1) % PORT_BLOCK
        port = block + _next_port[0]
        with socket.socket() as sock:
            try:
                sock.bind(('127.0.0.1', port))
                return port
            except OSError:
                continue
    raise RuntimeError('no free port in %d..%d' % (block, block + PORT_BLOCK - 1))


def _worker_index():
    return int(WORKER[2:]) if WORKER.startswith('gw') else 0


def http(method, url, token=None, body=None):
    """One request to a real server: its Response whatever the status (an error status is an
    answer too)."""
    headers = {'Content-Type': 'application/json'} if body is not None else {}
    if token:
        headers['Authorization'] = 'Bearer ' + token
    data = json.dumps(body).encode('utf-8') if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=40) as reply:
            return Response(reply.status, reply.getheaders(), reply.read())
    except urllib.error.HTTPError as error:
        return Response(error.code, error.headers.items(), error.read())


def wait_for(predicate, proc, timeout_s=30.0, log_path=None):
    """Until ``predicate()`` holds, failing at once when the process ``proc`` exits (with its
    log, given one). An OSError is a not yet: the server may not listen yet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            log_path.read_text() if log_path else 'exited with %s' % proc.returncode
        )
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError('not ready within %.0fs' % timeout_s)


def healthy(base):
    """For wait_for: the server at ``base`` answers /healthz with 200."""
    return lambda: http('GET', base + '/healthz').status == 200


def wait_healthy(base, proc, timeout_s=30.0, log_path=None):
    wait_for(healthy(base), proc, timeout_s, log_path)


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
        self.port = free_port()  # below 55536, as a cluster's would need
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


def require_binaries(*names):
    """Skip (locally) or fail (under CI=true) unless every named program is installed."""
    from tests.support.backends import IN_CI

    missing = [name for name in names if not shutil.which(name)]
    if missing:
        message = 'not installed: %s' % ', '.join(missing)
        if IN_CI:
            pytest.fail('CI requires ' + message)
        pytest.skip(message)


class RedisProcess:
    """One redis-server (or, with ``sentinel=True``, a sentinel) of the test's own, without
    persistence, on a free port; its configuration file lives in ``folder``. ``kill()`` is a
    kill -9; ``start()`` runs it again on the same port."""

    def __init__(self, folder, *args, sentinel=False, port=None):
        self.port = port or free_port()  # its bus port: + 10000
        self.folder = folder / ('redis-%d' % self.port)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.sentinel = sentinel
        self.process = None

    @property
    def address(self):
        return '127.0.0.1:%d' % self.port

    def client(self, **options):
        import redis

        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1, **options)

    def start(self, timeout_s=30):
        import redis

        config = self.folder / 'redis.conf'
        if not config.exists():  # a sentinel rewrites its file; a restart keeps what it learnt
            lines = ['port %d' % self.port, 'bind 127.0.0.1', 'dir %s' % self.folder]
            if not self.sentinel:
                lines += ['save ""', 'appendonly no']
            config.write_text('\n'.join(lines + self.args) + '\n')
        command = ['redis-server', str(config)] + (['--sentinel'] if self.sentinel else [])
        self.log = open(self.folder / 'log', 'ab')
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client().ping()
                return self
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def kill(self):
        """kill -9."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None
        if getattr(self, 'log', None):
            self.log.close()


class PrivateRedisCluster:
    """A Redis Cluster of ``masters`` primaries (no replicas) on free ports, the slots split
    evenly; ``url`` is its redis+cluster:// URL with every node as a seed."""

    def __init__(self, folder, masters=3):
        self.nodes = [
            RedisProcess(folder, 'cluster-enabled yes', 'cluster-node-timeout 2000')
            for _ in range(masters)
        ]

    @property
    def url(self):
        return 'redis+cluster://' + ','.join(node.address for node in self.nodes)

    def start(self, timeout_s=30):
        for node in self.nodes:
            node.start()
        step = 16384 // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * step - 1
            node.client().execute_command('CLUSTER ADDSLOTSRANGE', i * step, last)
        for node in self.nodes[1:]:
            node.client().execute_command('CLUSTER MEET', '127.0.0.1', self.nodes[0].port)
        deadline = time.monotonic() + timeout_s
        while not all(self._ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError('the cluster did not come up')
            time.sleep(0.1)
        return self

    def _ok(self, node):
        info = node.client(decode_responses=True).cluster('info')
        known = int(info.get('cluster_known_nodes', 0))
        return info.get('cluster_state') == 'ok' and known == len(self.nodes)

    def stop(self):
        for node in self.nodes:
            node.stop()


class SentinelGroup:
    """A master, ``replicas`` replicas and ``sentinels`` sentinels watching it as ``service``
    (failover after 1 s down); ``url`` is its redis+sentinel:// URL."""

    def __init__(self, folder, replicas=1, sentinels=3, service='aijob'):
        self.service = service
        self.master = RedisProcess(folder)
        self.replicas = [RedisProcess(folder) for _ in range(replicas)]
        quorum = sentinels // 2 + 1
        self.sentinels = [
            RedisProcess(
                folder,
                'sentinel monitor %s 127.0.0.1 %d %d' % (service, self.master.port, quorum),
                'sentinel down-after-milliseconds %s 1000' % service,
                'sentinel failover-timeout %s 5000' % service,
                'sentinel parallel-syncs %s 1' % service,
                sentinel=True,
            )
            for _ in range(sentinels)
        ]
        self.data_nodes = [self.master] + self.replicas

    @property
    def url(self):
        nodes = ','.join(s.address for s in self.sentinels)
        return 'redis+sentinel://%s/%s' % (nodes, self.service)

    def start(self, timeout_s=30):
        self.master.start()
        for replica in self.replicas:
            replica.args.append('replicaof 127.0.0.1 %d' % self.master.port)
            replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + timeout_s
        while not self._settled():
            if time.monotonic() > deadline:
                raise RuntimeError('the sentinels did not see the replicas')
            time.sleep(0.1)
        return self

    def _settled(self):
        for replica in self.replicas:
            link = replica.client(decode_responses=True).info('replication')
            if link.get('master_link_status') != 'up':
                return False
        for sentinel in self.sentinels:
            client = sentinel.client(decode_responses=True)
            if len(client.sentinel_slaves(self.service)) < len(self.replicas):
                return False
            if len(client.sentinel_sentinels(self.service)) < len(self.sentinels) - 1:
                return False
        return True

    def master_port(self):
        """The master's port as the first answering sentinel names it."""
        for sentinel in self.sentinels:
            try:
                return int(sentinel.client().sentinel_get_master_addr_by_name(self.service)[1])
            except Exception:
                continue
        return None

    def agreed_master_port(self):
        """The master's port if every sentinel names the same one, else None (just after a
        failover they learn it one by one)."""
        ports = set()
        for sentinel in self.sentinels:
            try:
                ports.add(int(sentinel.client().sentinel_get_master_addr_by_name(self.service)[1]))
            except Exception:
                return None
        return ports.pop() if len(ports) == 1 else None

    def tilts(self):
        """Each sentinel's TILT flag (it acts on nothing while stalled), for a failure message."""
        return [
            sentinel.client(decode_responses=True).info('sentinel').get('sentinel_tilt')
            for sentinel in self.sentinels
        ]

    def node_on(self, port):
        return next(node for node in self.data_nodes if node.port == port)

    def stop(self):
        for process in self.sentinels + self.data_nodes:
            process.stop()


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
        wait_healthy(self.base, self.process, timeout_s, self.log_path)

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
