"""Serving the API with gunicorn: ``web`` (the API only, several worker processes) and ``serve``
(one worker process that also runs the engine: dispatcher, worker pools and housekeeping).

Each gunicorn worker builds its own Runtime after the fork, so no database connection or Redis
socket is shared across processes. ``serve`` keeps a single process because its in-memory queue
lives in that process.

Both run gunicorn's ``gevent`` worker class (architecture decision 11). The entry point
(aijob.py) patches the standard library before anything is imported, so the master and every
worker it forks are cooperative from the start: every connection is a greenlet and pymysql,
redis-py, ``time.sleep`` and the threading primitives (bottle's request state and peewee's
connection state among them) cooperate. A long poll, a slow body or an idle
keep-alive connection then costs a greenlet, not a thread, and never stops ``/healthz``. In
``serve`` the engine's threads (dispatcher, worker pools, housekeeping) are greenlets of the same
hub: everything they wait on (the store, Redis, the provider's HTTP, sleeps, locks) is patched.
The ``worker`` process is not gunicorn and keeps real threads.
"""

import contextlib
import gc
import json
import math
import signal
import socket
import time

import gunicorn.util
from gevent import monkey
from gevent import socket as gevent_socket
from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.workers import ggevent

from .core import master_key, resolver
from .core.config import Config
from .core.errors import (
    ExpectationFailedError,
    ForbiddenError,
    HeadersTooLargeError,
    InvalidRequestError,
    RequestLineTooLongError,
    UnsupportedTransferCodingError,
)
from .core.logs import configure as configure_logging
from .core.logs import gunicorn_logconfig, log_event
from .core.redis_url import parse_redis_url
from .http.app import create_app
from .http.auth import TokenStore
from .runtime import Runtime

# gunicorn's worker timeout: with gevent, the worker's heartbeat only stops when its hub is
# blocked this long (a long poll or a slow client is a greenlet and never blocks it).
WORKER_TIMEOUT_S = 60
# An idle keep-alive connection, or one still sending its request headers, is closed after this.
KEEPALIVE_S = 5
# Connections one worker holds beyond its long polls (plain requests, slow and idle clients).
SPARE_CONNECTIONS = 1000
# After a 413, the rest of the refused body is read and dropped before the connection closes,
# up to this many times AIJOB_MAX_BODY_BYTES and for this long at most (see _linger).
REFUSED_BODY_LINGER_FACTOR = 4
REFUSED_BODY_LINGER_S = 5.0


# gunicorn's own refusals (a request it cannot parse) by status, as the API's errors.
GUNICORN_ERRORS = {
    403: ForbiddenError,
    414: RequestLineTooLongError,
    417: ExpectationFailedError,
    431: HeadersTooLargeError,
    501: UnsupportedTransferCodingError,
}


def write_json_error(sock, status_int, reason, mesg):
    """Stands in for gunicorn.util.write_error, which answers with an HTML page: every error of
    this service is JSON with a stable code. gunicorn's message may quote the request; only the
    reason phrase is kept."""
    error = GUNICORN_ERRORS.get(status_int)
    if error is not None:
        code, message = error.code, error.public_message
    elif status_int >= 500:
        code, message = 'INTERNAL_ERROR', 'Internal error.'
    else:
        code, message = InvalidRequestError.code, 'The request could not be parsed: %s.' % reason
    body = json.dumps({'error': {'code': code, 'message': message}}).encode('utf-8')
    head = (
        'HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n'
        'Content-Length: %d\r\n\r\n' % (status_int, reason, len(body))
    )
    gunicorn.util.write_nonblock(sock, head.encode('latin-1') + body)
    _drain_before_close(sock)


def _drain_before_close(sock, limit_s=1.0, limit_bytes=1 << 20):
    """gunicorn closes the socket next, with the rest of the refused request still unread, and
    such a close sends a reset that can destroy the answer before the client reads it. So: end
    our side, then read (and drop) what the client still sends until it closes, for a moment
    at most (a lingering close, as nginx's). Under gevent this waits in the connection's own
    greenlet."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(limit_s)
        deadline = time.monotonic() + limit_s
        received = 0
        while received < limit_bytes and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += len(chunk)
    except OSError:
        pass


class NoAccessLogger(glogging.Logger):
    """gunicorn's logger without its access log. gunicorn builds the access line's atoms for
    every request whenever a ``logconfig_dict`` is set, even though ours sends ``gunicorn.access``
    nowhere: 4 % of a status GET's CPU in a profile under load, spent on a line nobody reads.
    The app writes its own access line (``http.request``)."""

    @property
    def access_log_enabled(self):
        return False


class GeventWorker(ggevent.GeventWorker):
    """gunicorn's gevent worker for a process that aijob.py patched before any import: gunicorn's
    own ``patch_all()``, with other settings than ours, would warn and remove ``select.epoll``.
    Only the listening sockets still need gevent's wrapping. A process nobody patched (gunicorn
    started some other way) is patched here, as gunicorn would."""

    def patch(self):
        if not monkey.is_module_patched('socket'):
            monkey.patch_all(aggressive=False)
            resolver.install()
        self.sockets = [
            gevent_socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach())
            for s in self.sockets
        ]

    def handle_request(self, listener_name, req, sock, addr):
        """gunicorn's, then the lingering close of a request whose body was refused unread
        (RefusedBodies): a client that writes its whole body before it reads (urllib, requests)
        would otherwise meet a reset, not the answer. Such a connection always ends there (its
        unread rest cannot be told from a next request); gunicorn ends others with
        StopIteration."""
        try:
            kept = super().handle_request(listener_name, req, sock, addr)
        except StopIteration:
            _linger(req, sock)
            raise
        if _linger(req, sock):
            raise StopIteration('the rest of a refused body was dropped')
        return kept


class RefusedBodies:
    """gunicorn's pre_request and post_request hooks: they mark a request whose body will not
    be read whole with how much of its rest to drop (GeventWorker.handle_request)."""

    def __init__(self, max_body_bytes):
        self.max_body_bytes = max_body_bytes
        self.linger_bytes = REFUSED_BODY_LINGER_FACTOR * max_body_bytes

    def pre_request(self, worker, req):
        """A body declared larger than AIJOB_MAX_BODY_BYTES is never read, whatever the answer
        (413, or a 401 before it): the answer says ``Connection: close``."""
        if _declared_length(req) > self.max_body_bytes:
            req.force_close()
            req.aijob_linger_bytes = self.linger_bytes

    def post_request(self, worker, req, environ, resp):
        """A 413 to a body sent without a length (chunked), found too large while read."""
        if resp is not None and resp.status_code == 413:
            req.aijob_linger_bytes = self.linger_bytes


def _declared_length(req):
    """The request's Content-Length (gunicorn has checked it is a number), or 0."""
    for name, value in req.headers:
        if name == 'CONTENT-LENGTH':
            return int(value)
    return 0


def _linger(req, sock):
    """True when ``req``'s body was refused and its connection has had its lingering close."""
    limit_bytes = getattr(req, 'aijob_linger_bytes', 0)
    if limit_bytes:
        _drain_before_close(sock, REFUSED_BODY_LINGER_S, limit_bytes)
    return bool(limit_bytes)


def _early_signals(server, worker):
    """Right after the fork: a worker has the master's signal handlers until gunicorn installs
    its own; a SIGTERM in between would be lost and the worker would serve on until the master
    kills it. Caught here, it stops the worker as soon as it runs."""

    def stop(signum, frame):
        worker.alive = False

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, stop)


class AijobGunicorn(BaseApplication):
    def __init__(self, config, options, with_background=False):
        self.config = config
        self.options = options
        self.with_background = with_background
        self.runtime = None
        self.worker = None
        super().__init__()

    def load_config(self):
        for name, value in self.options.items():
            self.cfg.set(name, value)
        # gunicorn's workers look this up at each error, so the replacement covers every worker.
        gunicorn.util.write_error = write_json_error
        self.cfg.set('worker_exit', self._worker_exit)
        self.cfg.set('post_fork', self._post_fork)
        refused = RefusedBodies(self.config.max_body_bytes)
        self.cfg.set('pre_request', refused.pre_request)
        self.cfg.set('post_request', refused.post_request)

    def load(self):
        """Runs in each worker process, after the fork."""
        configure_logging()
        self.runtime = Runtime(self.config, role='serve' if self.with_background else 'web')
        if self.with_background:
            self.runtime.start_background()
        app = create_app(self.runtime)
        app.aijob_api.watch.stopping = self._stopping
        # What the worker built to serve (modules, the app, the OpenAPI document) lives as long
        # as it does: out of the collector's sight, a full collection no longer walks ~115 000
        # objects (50-90 ms with the hub stopped on a loaded 2-core machine; ~0 once frozen).
        gc.freeze()
        return app

    def _post_fork(self, server, worker):
        self.worker = worker
        _early_signals(server, worker)

    def _stopping(self):
        return self.worker is not None and not self.worker.alive

    def _worker_exit(self, server, worker):
        if self.runtime is not None:
            self.runtime.stop_background()
            self.runtime.close()


def run_gunicorn(config, options, hooks, with_background=False):
    """Serve with gunicorn, inside the extensions' ``gunicorn_master`` hooks (``hooks``: a
    runtime's, built in this master before the fork): the metrics' directory that every worker
    writes its counts into and any worker sums at a scrape (README "Metrics")."""
    with contextlib.ExitStack() as around:
        for make in hooks.gunicorn_master:
            around.enter_context(make())
        AijobGunicorn(config, options, with_background=with_background).run()


def gunicorn_options(config, host, port, workers):
    """gunicorn's settings for ``web`` and ``serve`` (and the benchmarks' floor app)."""
    # The long polls and the job event streams (their feature's cap; none when not installed).
    held = config.max_waiters + getattr(config, 'max_streams', 0)
    return {
        'bind': '%s:%d' % (host, port),
        'workers': workers,
        'worker_class': GeventWorker,
        'worker_connections': held + SPARE_CONNECTIONS,
        'timeout': WORKER_TIMEOUT_S,
        'graceful_timeout': config.shutdown_grace_ms // 1000 + 5,
        'keepalive': max(1, min(KEEPALIVE_S, math.ceil(config.request_timeout_ms / 1000))),
        'accesslog': None,
        'logger_class': NoAccessLogger,
        'logconfig_dict': gunicorn_logconfig(),
        'proc_name': 'aijob',
        # One shared default path would make concurrent instances fight over it.
        'control_socket_disable': True,
    }


def run_web(config, host, port, workers):
    """``python aijob.py web``: the API only; workers run nothing in the background. Refuses
    to start without a master key the store's webhooks or users' keys need."""
    configure_logging()
    runtime = Runtime(config, role='web-setup')
    try:
        master_key.require(config, runtime.store, runtime.hooks.keyed_tables)
    finally:
        runtime.close()  # nothing opened here may be inherited by the forked workers
    run_gunicorn(config, gunicorn_options(config, host, port, workers), runtime.hooks)


def with_dev_master_key(config):
    """(config, path of the development key file or None): ``serve`` with no
    AIJOB_CREDENTIAL_MASTER_KEY on SQLite uses a key of its own, kept beside the database
    (engine/core/master_key.py), so webhooks and users' keys work with no configuration."""
    path = None if config.credential_master_key else master_key.dev_key_path(config.database_url)
    if path is None:
        return config, None
    key, _ = master_key.load_or_create(path)
    return Config(dict(vars(config), credential_master_key=key)), path


def run_serve(config, host, port):
    """``python aijob.py serve``: everything in one process, for local development. Creates the
    schema, prints the URL, a fresh development admin token and where the development master
    key is kept (never the key), then serves."""
    configure_logging()
    config, key_path = with_dev_master_key(config)
    runtime = Runtime(config, role='serve-setup')
    try:
        runtime.create_schema()
        # A server database: the key is the operator's.
        master_key.require(config, runtime.store, runtime.hooks.keyed_tables)
        with runtime.store.connection():
            token = TokenStore(runtime.store).create('dev-admin', admin=True)
    finally:
        runtime.close()  # nothing opened here may be inherited by the forked worker
    url = 'http://%s:%d' % ('127.0.0.1' if host in ('0.0.0.0', '') else host, port)
    print(
        'aijob serving on %s (store %s, queue %s)'
        % (
            url,
            config.database_url.split('://', 1)[0],
            parse_redis_url(config.redis_url).describe() if config.uses_redis else 'in-memory',
        ),
        flush=True,
    )
    print('development admin token (user dev-admin, SUPER_ADMIN):', flush=True)
    print(token, flush=True)
    if key_path is not None:
        print("development master key (webhook secrets, users' keys): %s" % key_path, flush=True)
    log_event('serve.starting', url=url, master_key_file=key_path)
    run_gunicorn(
        config, gunicorn_options(config, host, port, 1), runtime.hooks, with_background=True
    )
