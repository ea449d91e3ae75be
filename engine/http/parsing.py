"""The current request read strictly: the query string, a JSON object body (size, media type,
a slow client's timeout), and headers as UTF-8 text. bottle's thread-local ``request`` stays in
the HTTP layer (here, the guard, the access checks and the routes); everything below the routes
takes and returns plain values."""

import logging

import bottle

from ..core.errors import (
    InvalidJsonError,
    InvalidRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
)
from ..core.logs import log_event
from . import json_body
from .replies import JSON_TYPE


def query():
    """The query string as ``{name: text}``. An empty value (``?until=``) is 400, as the
    document says (no parameter allows the empty string): it is not the same as leaving the
    parameter out, and guessing which the client meant would hide its bug."""
    params = {name: bottle.request.query.getunicode(name) for name in bottle.request.query}
    for name, value in params.items():
        if not value:
            raise InvalidRequestError('query parameter %s is empty' % name, field=name)
    return params


def json_object(max_bytes):
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


def header(name):
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


def idempotency_key():
    raw = bottle.request.environ.get('HTTP_IDEMPOTENCY_KEY')
    key = header('Idempotency-Key')
    if raw is not None and key is None:
        raise InvalidRequestError(
            'the Idempotency-Key header must be UTF-8 text', field='idempotencyKey'
        )
    return key


def if_none_match():
    raw = header('If-None-Match') or ''
    return {tag.strip().removeprefix('W/') for tag in raw.split(',') if tag.strip()}
