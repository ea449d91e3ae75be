"""AIJOB_METRICS_PORT of ``python aijob.py worker``: ``GET /metrics`` on a small threaded HTTP
server of its own (the worker serves no API), with the API's tokens and JSON errors."""

import contextlib
import json
import logging
import threading
from http import HTTPStatus
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ...core.errors import AiJobError, StoreUnavailableError
from ...core.logs import log_event
from .processes import use_single_process
from .routes import MetricsAccess
from .scrape import CONTENT_TYPE, scrape

SCRAPE_TIMEOUT_S = 10  # a scraper silent this long is dropped (the worker's own port)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S

    def log_message(self, format, *args):
        pass  # the scrape is logged as an event instead


def metrics_app(runtime, access):
    """A WSGI app answering ``GET /metrics`` only, with the API's JSON errors."""

    def app(environ, start_response):
        if environ.get('PATH_INFO') != '/metrics' or environ['REQUEST_METHOD'] != 'GET':
            return _error(start_response, '404 Not Found', 'NOT_FOUND', 'No such endpoint.')
        try:
            with runtime.store.connection():
                access.check(environ.get('HTTP_AUTHORIZATION'))
                body = scrape(runtime)
        except AiJobError as exc:
            return _error(
                start_response,
                '%d %s' % (exc.http_status, HTTPStatus(exc.http_status).phrase),
                exc.code,
                exc.public_message,
            )
        except Exception:
            log_event('metrics.scrape_failed', logging.WARNING, exc_info=True)
            unavailable = StoreUnavailableError()
            return _error(
                start_response, '503 Unavailable', unavailable.code, unavailable.public_message
            )
        start_response(
            '200 OK', [('Content-Type', CONTENT_TYPE), ('Content-Length', str(len(body)))]
        )
        return [body]

    return app


def _error(start_response, status, code, message):
    body = json.dumps({'error': {'code': code, 'message': message}}).encode('utf-8')
    start_response(
        status,
        [
            ('Content-Type', 'application/json'),
            ('Content-Length', str(len(body))),
            ('Cache-Control', 'no-store'),
        ],
    )
    return [body]


class MetricsServer:
    """AIJOB_METRICS_PORT of ``python aijob.py worker``: a small threaded HTTP server."""

    def __init__(self, runtime, host, port):
        access = MetricsAccess(runtime.store, runtime.config.metrics_token)
        self.httpd = make_server(
            host,
            port,
            metrics_app(runtime, access),
            server_class=_Server,
            handler_class=_QuietHandler,
        )
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name='metrics-http', daemon=True
        )

    def start(self):
        self.thread.start()
        log_event('metrics.listening', port=self.httpd.server_port)
        return self

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def worker_process(runtime):
    """Around ``python aijob.py worker``'s loops (the ``worker_process`` hook point): count in
    this process's memory, and serve the counts on AIJOB_METRICS_PORT when it is set."""
    use_single_process()
    config = runtime.config
    if config.metrics_port is None:
        yield None
        return
    server = MetricsServer(runtime, config.metrics_host, config.metrics_port).start()
    try:
        yield server
    finally:
        server.close()
