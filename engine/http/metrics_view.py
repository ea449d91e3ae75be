"""``GET /metrics``: the Prometheus scrape, for an admin token or AIJOB_METRICS_TOKEN (never
open), on the API of ``serve`` and ``web`` and on AIJOB_METRICS_PORT of ``worker``."""

import hmac
import json
import logging
import threading
from http import HTTPStatus
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..core import metrics
from ..core.errors import AiJobError, ForbiddenError, StoreUnavailableError, UnauthorizedError
from ..core.logs import log_event
from ..dispatch.scrape import CONTENT_TYPE, exposition
from ..features.batches.routes import batch_gauges
from ..features.gateway.cooldowns import cooldown_gauge
from .auth import TokenStore, bearer_token

SCRAPE_TIMEOUT_S = 10  # a scraper silent this long is dropped (the worker's own port)


class MetricsAccess:
    """Who may scrape: the AIJOB_METRICS_TOKEN bearer, or an admin's token. No token, or an
    unknown one, is UNAUTHORIZED; a user's token is FORBIDDEN."""

    def __init__(self, store, metrics_token):
        self.tokens = TokenStore(store)
        self.metrics_token = metrics_token

    def check(self, authorization_header):
        """Returns the principal (None for the metrics token); the caller holds a connection."""
        token = bearer_token(authorization_header)
        if token is None:
            raise UnauthorizedError()
        if self.metrics_token and hmac.compare_digest(
            token.encode('utf-8'), self.metrics_token.encode('utf-8')
        ):
            return None
        principal = self.tokens.authenticate(token)
        if principal is None:
            raise UnauthorizedError()
        if not principal.is_admin:
            raise ForbiddenError()
        return principal


def scrape(runtime):
    """The exposition text; the caller holds a store connection."""
    return exposition(runtime.store, runtime.queue, extra=gateway_collectors(runtime))


def gateway_collectors(runtime):
    """The gateway's gauges read at scrape time: every configured entry's cooldown, and the
    provider batches (open ones, the jobs in them, their cost)."""
    return [_Collect(lambda: [cooldown_gauge(runtime.ai.gateway)]), _Collect(batch_gauges)]


class _Collect:
    def __init__(self, families):
        self._families = families

    def collect(self):
        return self._families()


# ---------------------------------------------------------------- the worker's own port
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


def start_metrics_server(runtime):
    """For ``worker``: count in this process's memory (metrics.use_single_process), and serve
    the counts on AIJOB_METRICS_PORT when it is set (else None)."""
    config = runtime.config
    metrics.use_single_process()
    if config.metrics_port is None:
        return None
    return MetricsServer(runtime, config.metrics_host, config.metrics_port).start()
