"""Serving the API with gunicorn: ``web`` (the API only, several worker processes) and ``serve``
(one worker process that also runs the engine: dispatcher, worker pools and housekeeping).

Each gunicorn worker builds its own Runtime after the fork, so no database connection or Redis
socket is shared across processes. ``serve`` keeps a single process with threads because its
in-memory queue lives in that process.
"""

import json

import gunicorn.util
from gunicorn.app.base import BaseApplication

from ..core.errors import (
    ExpectationFailedError,
    ForbiddenError,
    HeadersTooLargeError,
    InvalidRequestError,
    RequestLineTooLongError,
    UnsupportedTransferCodingError,
)
from ..core.logs import configure as configure_logging
from ..core.logs import gunicorn_logconfig, log_event
from ..runtime import Runtime
from .app import create_app
from .auth import TokenStore

# A long poll (?waitMs=) holds a thread up to 30 s; gunicorn must not kill a worker for it.
REQUEST_TIMEOUT_S = 60


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


class AijobGunicorn(BaseApplication):
    def __init__(self, config, options, with_background=False):
        self.config = config
        self.options = options
        self.with_background = with_background
        self.runtime = None
        super().__init__()

    def load_config(self):
        for name, value in self.options.items():
            self.cfg.set(name, value)
        # gunicorn's workers look this up at each error, so the replacement covers every worker.
        gunicorn.util.write_error = write_json_error
        self.cfg.set('worker_exit', self._worker_exit)

    def load(self):
        """Runs in each worker process, after the fork."""
        configure_logging()
        self.runtime = Runtime(self.config, role='serve' if self.with_background else 'web')
        if self.with_background:
            self.runtime.start_background()
        return create_app(self.runtime)

    def _worker_exit(self, server, worker):
        if self.runtime is not None:
            self.runtime.stop_background()
            self.runtime.close()


def gunicorn_options(config, host, port, workers, threads):
    return {
        'bind': '%s:%d' % (host, port),
        'workers': workers,
        'worker_class': 'gthread',
        'threads': threads,
        'timeout': REQUEST_TIMEOUT_S,
        'graceful_timeout': config.shutdown_grace_ms // 1000 + 5,
        'keepalive': 5,
        'accesslog': None,
        'logconfig_dict': gunicorn_logconfig(),
        'proc_name': 'aijob',
        # One shared default path would make concurrent instances fight over it.
        'control_socket_disable': True,
    }


def run_web(config, host, port, workers):
    """``python aijob.py web``: the API only; workers run nothing in the background."""
    configure_logging()
    options = gunicorn_options(config, host, port, workers, config.web_threads)
    AijobGunicorn(config, options).run()


def run_serve(config, host, port):
    """``python aijob.py serve``: everything in one process, for local development. Creates the
    schema, prints the URL and a fresh development admin token, then serves."""
    configure_logging()
    runtime = Runtime(config, role='serve-setup')
    try:
        runtime.create_schema()
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
            'redis' if config.uses_redis else 'in-memory',
        ),
        flush=True,
    )
    print('development admin token (user dev-admin, SUPER_ADMIN):', flush=True)
    print(token, flush=True)
    log_event('serve.starting', url=url)
    options = gunicorn_options(config, host, port, 1, config.web_threads)
    AijobGunicorn(config, options, with_background=True).run()
