"""The bottle plugin every route runs inside, and bottle's own errors: a database connection for
the request (unless the route says ``db=False``), an AiJobError turned into its public JSON error
(by the error's ``code``, ``http_status`` and ``public_message``), anything unexpected into one
clean 500, one access-log line and the request's signal (core/signals.py)."""

import json
import logging
import time

import bottle
import peewee

from ..core.errors import (
    AiJobError,
    MethodNotAllowedError,
    NoSuchEndpointError,
    PayloadTooLargeError,
    StoreUnavailableError,
)
from ..core.logs import log_event
from ..core.signals import SILENT
from ..core.store import OperationalError, PoolExhausted
from .replies import INTERNAL_MESSAGE, JSON_TYPE, error_body, error_reply

# bottle's own errors (no route, wrong method, a body it cannot read) by status.
BOTTLE_ERRORS = {
    404: NoSuchEndpointError,
    405: MethodNotAllowedError,
    413: PayloadTooLargeError,
}


class Guard:
    """bottle plugin: a database connection for the request (unless the route says ``db=False``),
    error mapping, the access log and the request's signal."""

    api = 2
    name = 'aijob_guard'

    def __init__(self, store, request_timeout_s=None, signals=SILENT):
        self.store = store
        self.request_timeout_s = request_timeout_s
        self.signals = signals

    def apply(self, callback, route):
        uses_db = route.config.get('db', True)

        def guarded(*args, **kwargs):
            started = time.monotonic()
            bottle.request.environ['aijob.request_timeout_s'] = self.request_timeout_s
            result = self._run(callback, uses_db, args, kwargs)
            access_log(route, result.status_code, started, kwargs.get('job_id'))
            self.signals.http_request(
                route.method, route.rule, result.status_code, time.monotonic() - started
            )
            return result

        return guarded

    def _run(self, callback, uses_db, args, kwargs):
        try:
            if not uses_db:
                return callback(*args, **kwargs)
            with self.store.connection():
                return callback(*args, **kwargs)
        except AiJobError as exc:
            return error_reply(exc)
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except (OperationalError, peewee.InterfaceError, PoolExhausted):
            # The driver's error stays here; the client only learns that it may try again.
            log_event('http.store_unavailable', logging.WARNING, exc_info=True)
            return error_reply(StoreUnavailableError())
        except Exception:
            log_event('http.internal_error', logging.ERROR, exc_info=True)
            return error_reply(AiJobError())


def access_log(route, status, started, job_id):
    principal = bottle.request.environ.get('aijob.principal')
    log_event(
        'http.request',
        method=bottle.request.method,
        route=route.rule,
        status=status,
        duration_ms=round((time.monotonic() - started) * 1000, 1),
        job_id=job_id,
        user_id=principal.user_id if principal else None,
    )


def bottle_error(error):
    """bottle's own errors (no route, wrong method) as JSON errors."""
    status = error.status_code
    bottle.response.content_type = JSON_TYPE
    allow = bottle.response.headers.get('Allow')
    if status == 405 and allow:
        bottle.response.set_header('Allow', with_head(allow))
    if status in BOTTLE_ERRORS:
        known = BOTTLE_ERRORS[status]()
        return json.dumps(error_body(known.code, known.public_message))
    if status >= 500:
        return json.dumps(error_body('INTERNAL_ERROR', INTERNAL_MESSAGE))
    return json.dumps(error_body('INVALID_REQUEST', 'The request could not be processed.'))


def with_head(allow):
    """bottle's Allow of a 405 names the routes' methods; HEAD goes with GET, as the document
    and OPTIONS say."""
    methods = [method.strip() for method in allow.split(',')]
    if 'GET' in methods and 'HEAD' not in methods:
        methods.insert(methods.index('GET') + 1, 'HEAD')
    return ', '.join(methods)
