"""The HTTP API (contracts §7) as a bottle app: routes, bearer auth, JSON bodies and JSON errors.

bottle's thread-local ``request``/``response`` stay in this module; everything below the routes
takes and returns plain values. Every route runs inside ``_Guard``, which turns an AiJobError
into its public JSON error (by the error's ``code``, ``http_status`` and ``public_message``),
anything unexpected into one clean 500, and writes one access-log line.
"""

import datetime
import hashlib
import json
import logging
import re
import select
import socket
import threading
import time

import bottle
import peewee

from ..core import metrics
from ..core.errors import (
    AiJobError,
    ForbiddenError,
    InvalidJsonError,
    InvalidRequestError,
    JobNotFoundError,
    MethodNotAllowedError,
    NoSuchEndpointError,
    NotReadyError,
    PayloadTooLargeError,
    RequestTimeoutError,
    StoreUnavailableError,
    TooManyStreamsError,
    TooManyWaitersError,
    UnauthorizedError,
    UnknownCredentialError,
    UnknownJobTypeError,
    UnsupportedMediaTypeError,
)
from ..core.history import JobHistory
from ..core.lifecycle import RUNNING, TERMINAL
from ..core.logs import log_event
from ..core.models import AiJob
from ..core.service import CreateJobInput
from ..core.store import OperationalError, PoolExhausted
from ..execution.usage import usage_totals
from . import history_view, json_body, stream, text_feed, views
from . import params as admin_jobs
from .auth import TokenStore, bearer_token
from .batch_views import batch_view, list_batches, parse_list_query
from .budget_views import BudgetEndpoints
from .dashboard import Dashboard
from .metrics_view import CONTENT_TYPE as METRICS_TYPE
from .metrics_view import MetricsAccess, scrape
from .openapi import allowed_methods, build_openapi
from .openapi_batches import batch_paths, batch_schemas
from .openapi_budgets import budget_paths, budget_schemas
from .openapi_dashboard import dashboard_paths
from .openapi_push import push_paths, push_schemas
from .webhook_views import WebhookEndpoints

JSON_TYPE = 'application/json'
MAX_WAIT_MS = 30_000
USAGE_GROUPS = {'user': 'user', 'jobType': 'job_type'}
CREATE_FIELDS = (
    'jobType',
    'targetType',
    'targetId',
    'input',
    'idempotencyKey',
    'overrides',
    'webhookUrl',
)

INTERNAL_MESSAGE = 'Internal error.'
WATCH_CHUNK = 500  # job ids per batched re-read of the waiters' jobs
GONE_CHECK_S = 0.5  # a waiting request looks at its client's socket at least this often

# Any webhook id but job-secret, so that a DELETE of /api/ai/webhooks/job-secret is 405 and its
# Allow header names GET only, as the document says.
WEBHOOK_ID = '<webhook_id:re:(?!job-secret$)[^/]+>'

# bottle's own errors (no route, wrong method, a body it cannot read) by status.
BOTTLE_ERRORS = {
    404: NoSuchEndpointError,
    405: MethodNotAllowedError,
    413: PayloadTooLargeError,
}


# ---------------------------------------------------------------- responses
def encode(body):
    return json.dumps(body, separators=(',', ':'), ensure_ascii=False).encode('utf-8')


def reply(body, status=200, headers=None):
    """A JSON response; ``body`` is a JSON value, or bytes already encoded by ``encode``."""
    data = body if isinstance(body, bytes) else encode(body)
    all_headers = {'Content-Type': JSON_TYPE, 'Cache-Control': 'no-store'}
    all_headers.update(headers or {})
    return bottle.HTTPResponse(body=data, status=status, headers=all_headers)


def error_body(code, message, field=None):
    error = {'code': code, 'message': message}
    if field:
        error['field'] = field
    return {'error': error}


def error_reply(exc):
    """The JSON error for an AiJobError; a 5xx other than 503 hides everything but its code."""
    status = exc.http_status
    if status >= 500 and status != 503:
        return reply(error_body('INTERNAL_ERROR', INTERNAL_MESSAGE), 500)
    headers = {}
    retry_after = getattr(exc, 'retry_after_s', None)
    if retry_after is not None and status in (429, 503):
        headers['Retry-After'] = str(int(retry_after))
    return reply(
        error_body(exc.code, exc.public_message, getattr(exc, 'field', None)), status, headers
    )


class _Guard:
    """bottle plugin: a database connection for the request (unless the route says ``db=False``),
    error mapping and the access log."""

    api = 2
    name = 'aijob_guard'

    def __init__(self, store, request_timeout_s=None):
        self.store = store
        self.request_timeout_s = request_timeout_s

    def apply(self, callback, route):
        uses_db = route.config.get('db', True)

        def guarded(*args, **kwargs):
            started = time.monotonic()
            bottle.request.environ['aijob.request_timeout_s'] = self.request_timeout_s
            result = self._run(callback, uses_db, args, kwargs)
            _access_log(route, result.status_code, started, kwargs.get('job_id'))
            metrics.http_request(
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


def _access_log(route, status, started, job_id):
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


def _bottle_error(error):
    """bottle's own errors (no route, wrong method) as JSON errors."""
    status = error.status_code
    bottle.response.content_type = JSON_TYPE
    allow = bottle.response.headers.get('Allow')
    if status == 405 and allow:
        bottle.response.set_header('Allow', _with_head(allow))
    if status in BOTTLE_ERRORS:
        known = BOTTLE_ERRORS[status]()
        return json.dumps(error_body(known.code, known.public_message))
    if status >= 500:
        return json.dumps(error_body('INTERNAL_ERROR', INTERNAL_MESSAGE))
    return json.dumps(error_body('INVALID_REQUEST', 'The request could not be processed.'))


# ---------------------------------------------------------------- request helpers
def _query():
    """The query string as ``{name: text}``. An empty value (``?until=``) is 400, as the
    document says (no parameter allows the empty string): it is not the same as leaving the
    parameter out, and guessing which the client meant would hide its bug."""
    params = {name: bottle.request.query.getunicode(name) for name in bottle.request.query}
    for name, value in params.items():
        if not value:
            raise InvalidRequestError('query parameter %s is empty' % name, field=name)
    return params


def _json_body(max_bytes):
    """The request body as a JSON object: 413 over ``max_bytes``, 415 unless JSON, 400 unless an
    object. Reads at most ``max_bytes + 1`` bytes, whatever Content-Length claims."""
    environ = bottle.request.environ
    length = bottle.request.content_length
    if length > max_bytes:
        raise PayloadTooLargeError('The request body is larger than %d bytes.' % max_bytes)
    media_type = environ.get('CONTENT_TYPE', '').split(';')[0].strip().lower()
    if media_type != JSON_TYPE and not media_type.endswith('+json'):
        raise UnsupportedMediaTypeError()
    raw = _read_body(environ, max_bytes + 1 if length < 0 else length)
    if len(raw) > max_bytes:
        raise PayloadTooLargeError('The request body is larger than %d bytes.' % max_bytes)
    try:
        text = raw.decode('utf-8')
    except UnicodeError:
        raise InvalidJsonError('The request body is not UTF-8 text.') from None
    body = json_body.loads(text)
    if not isinstance(body, dict):
        raise InvalidJsonError('The request body must be a JSON object.')
    return body


def _read_body(environ, size):
    """``size`` bytes of the body at most. Under gevent (``serve`` and ``web``) a body that has
    not arrived within AIJOB_REQUEST_TIMEOUT_MS is REQUEST_TIMEOUT (408); the slow client held
    only its own greenlet meanwhile."""
    timeout_s = environ.get('aijob.request_timeout_s')
    if not timeout_s or not _cooperative():
        return environ['wsgi.input'].read(size)
    import gevent

    timer = gevent.Timeout(timeout_s)
    timer.start()
    try:
        return environ['wsgi.input'].read(size)
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        log_event('http.body_timeout', logging.WARNING, timeout_ms=int(timeout_s * 1000))
        raise RequestTimeoutError() from None
    finally:
        timer.close()


def _cooperative():
    """True in a gevent worker (sockets monkey-patched), where a greenlet may time out a read."""
    try:
        from gevent import monkey
    except ImportError:
        return False
    return monkey.is_module_patched('socket')


def _client_gone(environ):
    """True when the client of this request has closed its connection: the socket is readable
    and reading it (a peek, nothing consumed) gives end-of-file or an error. A client that sends
    its next request early is not gone. Without a server socket (the in-process test client)
    nobody is ever gone."""
    sock = environ.get('gunicorn.socket')
    if sock is None:
        return False
    try:
        # poll, not select: select() refuses descriptors above 1023, and a web process holding
        # a thousand waiting requests has those (each would look gone at once). The unpatched
        # poll: a zero-timeout system call that never waits, where gevent's would need the hub.
        poller = _original_poll()
        poller.register(sock.fileno(), select.POLLIN)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK) == b''
    except (OSError, ValueError):
        return True


def _original_poll():
    try:
        from gevent import monkey
    except ImportError:
        return select.poll()
    return monkey.get_original('select', 'poll')()


def _wait_ms():
    raw = bottle.request.query.get('waitMs')
    if raw is None:
        return 0
    wait_ms = admin_jobs.whole_number(raw, 0, MAX_WAIT_MS)
    if wait_ms is None:
        raise InvalidRequestError(
            'waitMs must be a whole number 0..%d' % MAX_WAIT_MS, field='waitMs'
        )
    return wait_ms


def _header(name):
    """A request header as text, or None. WSGI hands headers over as latin-1; a client's UTF-8
    is decoded, and bytes that are not UTF-8 count as no header at all (a bad token is then
    simply no token) rather than an error deep inside."""
    raw = bottle.request.environ.get('HTTP_' + name.upper().replace('-', '_'))
    if raw is None:
        return None
    try:
        return raw.encode('latin-1').decode('utf-8')
    except UnicodeError:
        return None


def _idempotency_key():
    raw = bottle.request.environ.get('HTTP_IDEMPOTENCY_KEY')
    key = _header('Idempotency-Key')
    if raw is not None and key is None:
        raise InvalidRequestError(
            'the Idempotency-Key header must be UTF-8 text', field='idempotencyKey'
        )
    return key


def _if_none_match():
    header = _header('If-None-Match') or ''
    return {tag.strip().removeprefix('W/') for tag in header.split(',') if tag.strip()}


def usage_query(params, now):
    """(since, until, groupBy) of GET /admin-api/ai/usage; by default the last 24 hours."""
    unknown = sorted(set(params) - {'since', 'until', 'groupBy'})
    if unknown:
        raise InvalidRequestError(
            'unknown query parameter %s (allowed: since, until, groupBy)' % unknown[0],
            field=unknown[0],
        )
    group_by = params.get('groupBy') or 'user'
    if group_by not in USAGE_GROUPS:
        raise InvalidRequestError('groupBy must be user or jobType', field='groupBy')
    until = admin_jobs.parse_rfc3339(params.get('until'), 'until') or now
    since = admin_jobs.parse_rfc3339(params.get('since'), 'since') or until - datetime.timedelta(
        days=1
    )
    return since, until, group_by  # since >= until: an empty range, no totals


def create_request(principal, body, header_key):
    """A CreateJobInput from a POST body: fields a client may not set are refused, never
    honoured; the job always belongs to the caller."""
    unknown = sorted(set(body) - set(CREATE_FIELDS))
    if unknown:
        raise InvalidRequestError(
            '%s may not be set by a client (allowed: %s)' % (unknown[0], ', '.join(CREATE_FIELDS)),
            field=unknown[0],
        )
    if not isinstance(body.get('jobType'), str) or not body['jobType']:
        raise InvalidRequestError('jobType is required and must be a string', field='jobType')
    body_key = body.get('idempotencyKey')
    if header_key is not None and body_key is not None and header_key != body_key:
        raise InvalidRequestError(
            'the Idempotency-Key header and idempotencyKey differ', field='idempotencyKey'
        )
    return CreateJobInput(
        user_id=principal.user_id,
        job_type=body['jobType'],
        target_type=body.get('targetType'),
        target_id=body.get('targetId'),
        input=body.get('input', {}),
        idempotency_key=header_key if header_key is not None else body_key,
        overrides=body.get('overrides') or {},
        webhook_url=body.get('webhookUrl'),
    )


# ---------------------------------------------------------------- waiting for a change
class _Waiter:
    __slots__ = ('job_id', 'user_id', 'changed', 'seen', 'due', '_lock')

    def __init__(self, job_id, user_id):
        self.job_id, self.user_id = job_id, user_id
        self.changed = threading.Event()
        self.seen = None  # the job's status columns as the watcher last saw them
        self.due = set()  # what changed since the waiter last looked: history, text (a stream)
        self._lock = threading.Lock()

    def wake(self, what):
        with self._lock:
            self.due.add(what)
            self.changed.set()

    def take(self):
        """What changed since the last call, the wake-up cleared in the same step (a wake
        that comes after it is kept for the next call)."""
        with self._lock:
            self.changed.clear()
            due, self.due = self.due, set()
        return due


class Watch:
    """The ``?waitMs=`` requests of this process, capped per process and per user, and one loop
    that re-reads all their jobs' status columns in one query per poll interval (not one per
    waiter) and wakes the waiters whose job changed. A waiter holds no database connection while
    it waits. Under gevent the loop is a greenlet; in the in-process test client, a thread.

    The job streams (stream.py) have a watch of their own: ``read`` is then what they wait on (the
    latest history id of each job), and ``too_many`` their 429."""

    def __init__(
        self, store, poll_s, max_waiters, max_per_user, read=None, too_many=TooManyWaitersError
    ):
        self.store = store
        self.poll_s = poll_s
        self.max_waiters = max_waiters
        self.max_per_user = max_per_user
        self.read = read or self._read
        self.too_many = too_many
        self._lock = threading.Lock()
        self._by_job = {}  # job id -> set of _Waiter
        self._per_user = {}
        self._count = 0
        self._loop = None
        # Set by the server: true once this process is shutting down; waits end then (the
        # client polls again elsewhere) instead of holding up the graceful stop.
        self.stopping = lambda: False

    @property
    def count(self):
        return self._count

    def enter(self, job_id, user_id):
        """A new waiter, or TOO_MANY_WAITERS (429) over either cap."""
        with self._lock:
            mine = self._per_user.get(user_id, 0)
            if self._count >= self.max_waiters or mine >= self.max_per_user:
                raise self.too_many()
            waiter = _Waiter(job_id, user_id)
            self._count += 1
            self._per_user[user_id] = mine + 1
            self._by_job.setdefault(job_id, set()).add(waiter)
            if self._loop is None:
                self._loop = threading.Thread(target=self._run, name='status-watch', daemon=True)
                self._loop.start()
        return waiter

    def leave(self, waiter):
        with self._lock:
            self._count -= 1
            left = self._per_user[waiter.user_id] - 1
            if left:
                self._per_user[waiter.user_id] = left
            else:
                del self._per_user[waiter.user_id]
            waiters = self._by_job[waiter.job_id]
            waiters.discard(waiter)
            if not waiters:
                del self._by_job[waiter.job_id]

    def _run(self):
        while True:
            with self._lock:
                job_ids = list(self._by_job)
                if not job_ids:
                    self._loop = None
                    return
            try:
                rows = self.read(job_ids)
            except Exception:
                # Every waiter re-reads on its own instead and answers 503 if the store is gone.
                log_event('http.watch_failed', logging.WARNING, exc_info=True)
                rows = None
            with self._lock:
                for job_id, waiters in self._by_job.items():
                    for waiter in waiters:
                        if rows is None:
                            waiter.wake(text_feed.HISTORY)
                            continue
                        seen = rows.get(job_id)
                        if seen != waiter.seen:
                            # The first sighting wakes the waiter once too: the job may have
                            # changed between the waiter's own read and this one.
                            waiter.seen = seen
                            waiter.wake(text_feed.HISTORY)
            time.sleep(self.poll_s)

    def _read(self, job_ids):
        """{job id: its status columns}: what a ``?waitMs=`` request waits on."""
        rows = {}
        with self.store.connection():
            for start in range(0, len(job_ids), WATCH_CHUNK):
                chunk = job_ids[start : start + WATCH_CHUNK]
                query = AiJob.select(*views.STATUS_COLUMNS).where(AiJob.id.in_(chunk)).tuples()
                for row in query:
                    rows[row[0]] = row
        return rows


# ---------------------------------------------------------------- the routes
class Api:
    def __init__(self, runtime):
        self.runtime = runtime
        self.store = runtime.store
        self.tokens = TokenStore(runtime.store)
        self.max_body_bytes = runtime.config.max_body_bytes
        self.wait_poll_s = runtime.config.status_wait_poll_ms / 1000.0
        self.watch = Watch(
            runtime.store,
            self.wait_poll_s,
            runtime.config.max_waiters,
            runtime.config.max_waiters_per_user,
        )
        self.streams = Watch(
            runtime.store,
            self.wait_poll_s,
            runtime.config.max_streams,
            runtime.config.max_streams_per_user,
            read=stream.watch_reader(runtime.store),
            too_many=TooManyStreamsError,
        )
        self.text_feed = text_feed.TextFeed(runtime.text_channel)
        job_types = sorted(d.job_type for d in runtime.registry.get_all())
        self.openapi = build_openapi(
            runtime.registry,
            dict(push_paths(), **dashboard_paths(), **budget_paths(), **batch_paths()),
            dict(push_schemas(job_types), **budget_schemas(job_types), **batch_schemas()),
            prompt_versions=runtime.ai.prompt_versions,
        )
        self.push = WebhookEndpoints(runtime)
        self.budgets = BudgetEndpoints(runtime)
        self.metrics_access = MetricsAccess(runtime.store, runtime.config.metrics_token)

    # -- auth
    def caller(self):
        token = bearer_token(_header('Authorization'))
        principal = self.tokens.authenticate(token) if token else None
        if principal is None:
            raise UnauthorizedError()
        bottle.request.environ['aijob.principal'] = principal
        return principal

    def admin(self):
        principal = self.caller()
        if not principal.is_admin:
            raise ForbiddenError()
        return principal

    def visible_job(self, job_id, principal, admin_sees_all=True):
        return self.visible_status(job_id, principal, admin_sees_all)[0]

    def visible_status(self, job_id, principal, admin_sees_all=True):
        """(job, artifact references) if ``principal`` may see the job; otherwise JOB_NOT_FOUND,
        never 403, so that job ids of other users cannot even be confirmed."""
        job, refs = views.find_for_status(job_id)
        if job is None or not (
            job.user_id == principal.user_id or (admin_sees_all and principal.is_admin)
        ):
            raise JobNotFoundError(job_id)
        return job, refs

    # -- user endpoints
    def create_job(self):
        principal = self.caller()
        body = _json_body(self.max_body_bytes)
        request = create_request(principal, body, _idempotency_key())
        if not self.runtime.registry.get(request.job_type).api_creatable:
            raise UnknownJobTypeError(request.job_type)  # internal-only types stay unlisted
        if request.webhook_url is not None and not self.push.signer.enabled:
            self.runtime.service.check_request(request)  # a bad body is a 400 all the same
            self.push.require_signer()
        result = self.runtime.service.create_job(request)
        job = result.job
        if result.created:
            log_event(
                'job.created',
                job_id=job.id,
                job_type=job.job_type,
                status=job.lifecycle_status,
                user_id=job.user_id,
                queue=job.queue_name,
            )
        return reply(
            self.status_body(job),
            201 if result.created else 200,
            {'Location': '/api/ai/jobs/%s' % job.id},
        )

    def get_job(self, job_id):
        """The job's status; with ``waitMs`` it first waits for a change. The route holds no
        database connection of its own (``db=False``): one unit of work reads, and a wait takes
        one only for each re-read."""
        with self.store.connection():
            principal = self.caller()
            wait_ms, known = _wait_ms(), _if_none_match()
            body, etag, data = self.status_with_etag(*self.visible_status(job_id, principal))
        if wait_ms and etag in (known or {etag}) and body['lifecycleStatus'] not in TERMINAL:
            waiter = self.watch.enter(job_id, principal.user_id)
            try:
                body, etag, data = self.wait_for_change(waiter, body, etag, data, known, wait_ms)
            finally:
                self.watch.leave(waiter)
        if etag in known:
            return bottle.HTTPResponse(
                status=304, headers={'ETag': etag, 'Cache-Control': 'no-cache'}
            )
        return reply(data, 200, {'ETag': etag, 'Cache-Control': 'no-cache'})

    def wait_for_change(self, waiter, body, etag, data, known, wait_ms):
        """Wait until the job differs from what the client has (its If-None-Match, else what it
        would have got now), it is terminal, time is up, or the client has gone away (then the
        wait stops at once: nothing is read for nobody). The watch wakes the waiter when the
        job's row changed; only then does it read the whole status again."""
        baseline = known or {etag}
        deadline = time.monotonic() + wait_ms / 1000.0
        environ = bottle.request.environ
        while etag in baseline and body['lifecycleStatus'] not in TERMINAL:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            woken = waiter.changed.wait(min(GONE_CHECK_S, remaining))
            if _client_gone(environ):
                log_event('http.wait_abandoned', job_id=waiter.job_id, user_id=waiter.user_id)
                break
            if self.watch.stopping():
                break
            if not woken:
                continue
            waiter.changed.clear()
            with self.store.connection():
                job, refs = views.find_for_status(waiter.job_id)
            if job is None:
                raise JobNotFoundError(waiter.job_id)
            body, etag, data = self.status_with_etag(job, refs)
        return body, etag, data

    def stream_job(self, job_id):
        """The job's live event stream (stream.py). Everything that can be refused is refused
        here, as a JSON error, before the first byte of the stream; the route holds no database
        connection while the stream runs (``db=False``)."""
        with self.store.connection():
            principal = self.caller()
            position = stream.parse_last_event_id(_header('Last-Event-ID'))
            fresh = position is None
            if fresh:
                # The latest event id before the status (READ COMMITTED): a change committed
                # between the two reads is in the status and is also sent as the next event,
                # never lost.
                latest = stream.latest_event_ids([job_id]).get(job_id, 0)
                position = stream.Position(latest)
            job, refs = self.visible_status(job_id, principal)
            ended = job.lifecycle_status in TERMINAL
            after_id = position.history_id
            if not fresh and ended and not JobHistory(self.store).list(job_id, after_id, 1):
                # Nothing after the client's last event and nothing will come: 204 tells an
                # EventSource to stop reconnecting.
                return bottle.HTTPResponse(status=204, headers={'Cache-Control': 'no-store'})
        opening = None
        if fresh:
            opening = stream.message('status', self.status_body(job, refs), str(after_id))
        waiter = self.streams.enter(job_id, principal.user_id)
        # The live text only while the job runs: a stream opened after its end gets its final
        # status, as one that never saw text would.
        text = None
        if not ended:
            text = text_feed.TextFollower(
                self.runtime.text_channel, self.text_feed, waiter, position.attempt, position.offset
            )
        config = self.runtime.config
        settings = (config.stream_heartbeat_ms / 1000.0, config.stream_max_s, GONE_CHECK_S)
        environ = bottle.request.environ
        body = stream.JobStream(
            self.store,
            self.streams,
            waiter,
            position,
            opening,
            settings,
            lambda: _client_gone(environ),
            fresh and ended,
            text,
        )
        log_event('http.stream_opened', job_id=job_id, user_id=principal.user_id)
        headers = {
            'Content-Type': stream.CONTENT_TYPE,
            'Cache-Control': 'no-store',
            'X-Accel-Buffering': 'no',  # a proxy in front must pass each event on at once
        }
        return bottle.HTTPResponse(body=body, status=200, headers=headers)

    def status_body(self, job, refs=None):
        """JobStatusResponse; ``refs`` when the caller read them with the job already."""
        if refs is None and job.lifecycle_status == 'succeeded':
            refs = views.artifact_refs([job.id])[job.id]
        return views.job_status(job, refs or ())

    def status_with_etag(self, job, refs):
        """(body, ETag, encoded body): the tag is a digest of the bytes sent, which job_status
        builds in a fixed key order, so the same status always has the same tag."""
        body = self.status_body(job, refs)
        data = encode(body)
        return body, '"%s"' % hashlib.sha256(data).hexdigest()[:32], data

    def get_artifacts(self, job_id):
        job = self.visible_job(job_id, self.caller())
        return reply(views.artifact_contents(job))

    def get_events(self, job_id):
        """The job's transition history (architecture decision 14), oldest first: the owner's
        view (no worker ids, no internal messages), or everything for SUPER_ADMIN."""
        principal = self.caller()
        job = self.visible_job(job_id, principal)
        after, limit = history_view.parse_query(_query())
        body = history_view.job_events(self.store, job, after, limit, full=principal.is_admin)
        return reply(body)

    def cancel_job(self, job_id):
        principal = self.caller()
        job = self.visible_job(job_id, principal, admin_sees_all=False)
        job = self.runtime.service.cancel_job(job.id)
        log_event('job.cancel', job_id=job.id, job_type=job.job_type, status=job.lifecycle_status)
        # One rule (contracts §5.4): the code follows the status the answer carries. A job no
        # worker holds (queued, deferred, parked in a batch) is cancelled now: 200; one a worker
        # holds is still running until the engine stops it: 202.
        return reply(self.status_body(job), 202 if job.lifecycle_status == RUNNING else 200)

    def list_jobs(self):
        """The caller's own jobs, newest first: the admin list's filters and cursor, always
        restricted to the caller (a userId filter is refused, not honoured)."""
        principal = self.caller()
        params = _query()
        if 'userId' in params:
            raise InvalidRequestError('userId is for the admin list only', field='userId')
        query = admin_jobs.parse_query(dict(params, userId=principal.user_id), strict=True)
        jobs, next_cursor = admin_jobs.list_jobs(query)
        refs = views.artifact_refs([job.id for job in jobs if job.lifecycle_status == 'succeeded'])
        items = [views.job_status(job, refs.get(job.id, ())) for job in jobs]
        return reply({'items': items, 'nextCursor': next_cursor, 'limit': query.limit})

    # -- admin endpoints
    def admin_list_jobs(self):
        self.admin()
        query = admin_jobs.parse_query(_query(), strict=True)
        jobs, next_cursor = admin_jobs.list_jobs(query)
        refs = views.artifact_refs([job.id for job in jobs if job.lifecycle_status == 'succeeded'])
        items = [views.admin_job(job, refs.get(job.id, ())) for job in jobs]
        return reply({'items': items, 'nextCursor': next_cursor, 'limit': query.limit})

    def admin_retry_job(self, job_id):
        self.admin()
        job = self.runtime.service.retry_job(job_id)
        log_event(
            'job.retried',
            job_id=job.id,
            job_type=job.job_type,
            retry_of_job_id=job_id,
            status=job.lifecycle_status,
        )
        return reply(views.admin_job(job), 201, {'Location': '/api/ai/jobs/%s' % job.id})

    # -- users' provider keys; the key itself never comes back, only its mask
    def register_credential(self):
        principal = self.caller()
        body = _json_body(self.max_body_bytes)
        unknown = sorted(set(body) - {'provider', 'apiKey'})
        if unknown:
            raise InvalidRequestError(
                '%s is not a credential field (allowed: provider, apiKey)' % unknown[0],
                field=unknown[0],
            )
        info = self.runtime.ai.credential_store.register(
            principal.user_id, body.get('provider'), body.get('apiKey')
        )
        log_event(
            'credential.registered',
            credential_id=info.id,
            provider=info.provider,
            user_id=principal.user_id,
        )
        return reply(views.credential(info), 201)

    def list_credentials(self):
        principal = self.caller()
        infos = self.runtime.ai.credential_store.list(principal.user_id)
        return reply({'items': [views.credential(info) for info in infos]})

    def delete_credential(self, credential_id):
        principal = self.caller()
        if not self.runtime.ai.credential_store.delete(principal.user_id, credential_id):
            raise UnknownCredentialError()
        log_event('credential.deleted', credential_id=credential_id, user_id=principal.user_id)
        return bottle.HTTPResponse(status=204)

    # -- webhooks (architecture decision 15); the secret is shown once, at creation
    def create_webhook(self):
        principal = self.caller()
        endpoint = self.push.create(principal.user_id, _json_body(self.max_body_bytes))
        log_event(
            'webhook.registered', endpoint_id=endpoint['webhookId'], user_id=principal.user_id
        )
        return reply(endpoint, 201)

    def list_webhooks(self):
        return reply(self.push.list(self.caller().user_id))

    def delete_webhook(self, webhook_id):
        principal = self.caller()
        self.push.delete(principal.user_id, webhook_id)
        log_event('webhook.deleted', endpoint_id=webhook_id, user_id=principal.user_id)
        return bottle.HTTPResponse(status=204)

    def webhook_job_secret(self):
        return reply(self.push.job_secret(self.caller().user_id))

    def admin_list_deliveries(self):
        self.admin()
        return reply(self.push.list_deliveries(_query()))

    def admin_redeliver(self, delivery_id):
        self.admin()
        delivery = self.push.redeliver(delivery_id)
        log_event('webhook.redeliver', delivery_id=delivery_id)
        return reply(delivery)

    def admin_usage(self):
        self.admin()
        since, until, group_by = usage_query(_query(), self.store.clock())
        totals = usage_totals(since, until, USAGE_GROUPS[group_by])
        return reply(
            {
                'since': views.iso(since),
                'until': views.iso(until),
                'groupBy': group_by,
                'totals': totals,
            }
        )

    # -- budgets in money (engine/gateway/budgets.py)
    def admin_put_budget(self):
        self.admin()
        view, created = self.budgets.put(_json_body(self.max_body_bytes))
        log_event('budget.saved', budget_id=view['budgetId'], created=created)
        return reply(view, 201 if created else 200)

    def admin_list_budgets(self):
        self.admin()
        return reply(self.budgets.list())

    def admin_delete_budget(self, budget_id):
        self.admin()
        self.budgets.delete(budget_id)
        log_event('budget.deleted', budget_id=budget_id)
        return bottle.HTTPResponse(status=204)

    # -- provider batches (engine/gateway/batches/)
    def admin_list_batches(self):
        self.admin()
        state, limit, after = parse_list_query(_query())
        batches, next_cursor = list_batches(state, limit, after)
        return reply(
            {'items': [batch_view(b) for b in batches], 'nextCursor': next_cursor, 'limit': limit}
        )

    # -- operations
    def healthz(self):
        return reply({'status': 'ok'})

    def readyz(self):
        # A write-free query on the store; a write on the queue, wherever its shards live (a
        # read-only replica or a lost master answers a ping but takes no job).
        checks = {
            'database': _check(self.store.ping),
            'queue': _check(self.runtime.queue.check_ready),
        }
        if all(value == 'ok' for value in checks.values()):
            return reply({'status': 'ready', 'checks': checks})
        not_ready = NotReadyError()
        body = error_body(not_ready.code, not_ready.public_message)
        body['checks'] = checks
        return reply(body, 503, {'Retry-After': str(not_ready.retry_after_s)})

    def openapi_document(self):
        return reply(self.openapi)

    def metrics(self):
        """The Prometheus scrape (README "Metrics"): admin token or AIJOB_METRICS_TOKEN."""
        principal = self.metrics_access.check(_header('Authorization'))
        bottle.request.environ['aijob.principal'] = principal
        return bottle.HTTPResponse(
            body=scrape(self.runtime),
            status=200,
            headers={'Content-Type': METRICS_TYPE, 'Cache-Control': 'no-store'},
        )


def _check(ping):
    try:
        ping()
        return 'ok'
    except AiJobError:
        return 'unavailable'


def create_app(runtime):
    """The WSGI application for ``runtime``."""
    api = Api(runtime)
    app = bottle.Bottle(catchall=True)
    app.install(_Guard(runtime.store, runtime.config.request_timeout_ms / 1000.0))
    app.default_error_handler = _bottle_error
    app.aijob_api = api  # the server reaches the watch through it
    routes = (
        ('POST', '/api/ai/jobs', api.create_job, True),
        ('GET', '/api/ai/jobs', api.list_jobs, True),
        ('GET', '/api/ai/jobs/<job_id>', api.get_job, False),  # takes its own connections
        ('GET', '/api/ai/jobs/<job_id>/artifacts', api.get_artifacts, True),
        ('GET', '/api/ai/jobs/<job_id>/stream', api.stream_job, False),  # its own connections
        ('GET', '/api/ai/jobs/<job_id>/events', api.get_events, True),
        ('POST', '/api/ai/jobs/<job_id>/cancel', api.cancel_job, True),
        ('GET', '/admin-api/ai/jobs', api.admin_list_jobs, True),
        ('POST', '/admin-api/ai/jobs/<job_id>/retry', api.admin_retry_job, True),
        ('POST', '/api/ai/credentials', api.register_credential, True),
        ('GET', '/api/ai/credentials', api.list_credentials, True),
        ('DELETE', '/api/ai/credentials/<credential_id>', api.delete_credential, True),
        ('GET', '/admin-api/ai/usage', api.admin_usage, True),
        ('PUT', '/admin-api/ai/budgets', api.admin_put_budget, True),
        ('GET', '/admin-api/ai/budgets', api.admin_list_budgets, True),
        ('DELETE', '/admin-api/ai/budgets/<budget_id>', api.admin_delete_budget, True),
        ('GET', '/admin-api/ai/batches', api.admin_list_batches, True),
        ('POST', '/api/ai/webhooks', api.create_webhook, True),
        ('GET', '/api/ai/webhooks', api.list_webhooks, True),
        ('GET', '/api/ai/webhooks/job-secret', api.webhook_job_secret, True),
        ('DELETE', '/api/ai/webhooks/' + WEBHOOK_ID, api.delete_webhook, True),
        ('GET', '/admin-api/ai/webhook-deliveries', api.admin_list_deliveries, True),
        (
            'POST',
            '/admin-api/ai/webhook-deliveries/<delivery_id>/redeliver',
            api.admin_redeliver,
            True,
        ),
        ('GET', '/healthz', api.healthz, False),
        ('GET', '/readyz', api.readyz, False),
        ('GET', '/openapi.json', api.openapi_document, False),
        ('GET', '/metrics', api.metrics, True),
    )
    routes += Dashboard(runtime).routes()
    for method, path, callback, uses_db in routes:
        app.route(path, method, callback, db=uses_db)
    for path, allow in _allow_headers(api.openapi, routes).items():
        app.route(path, 'OPTIONS', _options(allow), db=False)
    return app


def _allow_headers(document, routes):
    """{bottle route path: its Allow header}, from the document, whose paths these are."""
    allow = {}
    for _, path, _, _ in routes:
        template = re.sub(r'<(\w+)(:[^>]*)?>', lambda m: '{%s}' % _camel(m.group(1)), path)
        operations = document['paths'].get(template)
        if operations is not None:
            allow[path] = allowed_methods(operations)
    return allow


def _with_head(allow):
    """bottle's Allow of a 405 names the routes' methods; HEAD goes with GET, as the document
    and OPTIONS say."""
    methods = [method.strip() for method in allow.split(',')]
    if 'GET' in methods and 'HEAD' not in methods:
        methods.insert(methods.index('GET') + 1, 'HEAD')
    return ', '.join(methods)


def _camel(name):
    head, *rest = name.split('_')
    return head + ''.join(part.title() for part in rest)


def _options(allow):
    def options(**path_parameters):
        return bottle.HTTPResponse(status=204, headers={'Allow': allow})

    return options
