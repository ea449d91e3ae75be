"""The JSON answers every route gives: a body encoded once, and the public error body
``{"error": {"code", "message"}}`` of an AiJobError (contracts §7)."""

import json

import bottle

JSON_TYPE = 'application/json'
INTERNAL_MESSAGE = 'Internal error.'


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
