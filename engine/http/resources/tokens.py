"""The admin tokens API (issue 33): ``POST/GET /admin-api/ai/tokens`` and ``DELETE
/admin-api/ai/tokens/{tokenId}``. A token of any role (user, service, SUPER_ADMIN) is shown once,
in the create's answer; a list shows its first characters only, with its role, name, creation
and last use. With its part of the OpenAPI document."""

import bottle

from ...core.errors import InvalidRequestError, TokenNotFoundError
from ...core.logs import log_event
from .. import parsing
from ..auth import HINT_CHARS, ROLES
from ..openapi import NULLABLE_TIME, TIME, error_responses, json_response, query_param, ref
from ..replies import reply
from ..views import iso

FIELDS = ('role', 'name')
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_TOKEN_ID = 2**63 - 1
NAME_PATTERN = r'^\S{1,64}$'


class Tokens:
    """SUPER_ADMIN's view of the API tokens."""

    def __init__(self, runtime, access):
        self.access = access
        self.tokens = access.tokens
        self.max_body_bytes = runtime.config.max_body_bytes

    def routes(self):
        return (
            ('POST', '/admin-api/ai/tokens', self.create_token, True),
            ('GET', '/admin-api/ai/tokens', self.list_tokens, True),
            ('DELETE', '/admin-api/ai/tokens/<token_id>', self.revoke_token, True),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        return _schemas()

    def create_token(self):
        admin = self.access.admin()
        body = parsing.json_object(self.max_body_bytes)
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise InvalidRequestError(
                '%s is not a token field (allowed: role, name)' % unknown[0], field=unknown[0]
            )
        if body.get('role') not in ROLES:
            raise InvalidRequestError('role must be one of %s' % ', '.join(ROLES), field='role')
        try:
            token, token_id = self.tokens.issue(body.get('name'), body['role'])
        except ValueError as exc:
            raise InvalidRequestError(str(exc), field='name') from None
        row = self.tokens.get(token_id)
        log_event('token.created', token_id=token_id, role=row.role, by=admin.user_id)
        return reply(dict(token_view(row), token=token), 201)

    def list_tokens(self):
        self.access.admin()
        params = parsing.query()
        unknown = sorted(set(params) - {'after', 'limit'})
        if unknown:
            raise InvalidRequestError(
                'unknown query parameter %s (allowed: after, limit)' % unknown[0], field=unknown[0]
            )
        after = _whole(params.get('after', '0'), 0, MAX_TOKEN_ID, 'after')
        limit = _whole(params.get('limit', str(DEFAULT_LIMIT)), 1, MAX_LIMIT, 'limit')
        rows = self.tokens.list(after, limit)
        next_after = str(rows[-1].id) if len(rows) == limit else None
        return reply({'items': [token_view(row) for row in rows], 'nextAfter': next_after})

    def revoke_token(self, token_id):
        admin = self.access.admin()
        number = _whole(token_id, 1, MAX_TOKEN_ID, None)
        if number is None or not self.tokens.revoke_id(number):
            raise TokenNotFoundError()
        log_event('token.revoked', token_id=number, by=admin.user_id)
        return bottle.HTTPResponse(status=204)


def token_view(row):
    """A token as a list shows it: never the token, only its first characters."""
    return {
        'tokenId': str(row.id),
        'role': row.role,
        'name': row.user_id,
        'tokenHint': (row.token_hint + '…') if row.token_hint else None,
        'createdAt': iso(row.created_at),
        'lastUsedAt': iso(row.last_used_at),
    }


def _whole(text, low, high, field):
    """``text`` as a whole number in [low, high]; 400 naming ``field`` (None: a path id, whose
    bad form is simply not found)."""
    if text.isascii() and text.isdigit() and len(text) <= 19 and low <= int(text) <= high:
        return int(text)
    if field is None:
        return None
    raise InvalidRequestError('%s must be a whole number %d..%d' % (field, low, high), field=field)


def token_schema(**extra):
    """A token as the list shows it; ``extra``: required properties the create adds."""
    schema = {
        'type': 'object',
        'additionalProperties': False,
        'required': ['tokenId', 'role', 'name', 'tokenHint', 'createdAt', 'lastUsedAt'],
        'properties': {
            'tokenId': {'type': 'string', 'pattern': '^[0-9]+$'},
            'role': {'enum': list(ROLES)},
            'name': {'type': 'string'},
            'tokenHint': {
                'type': ['string', 'null'],
                'description': 'The first %d characters of the token, to tell tokens apart '
                '(null for tokens made before hints were kept).' % HINT_CHARS,
            },
            'createdAt': TIME,
            'lastUsedAt': dict(
                NULLABLE_TIME,
                description='Written at most once a minute per token: within a minute.',
            ),
        },
    }
    schema['properties'].update(extra)
    schema['required'] += list(extra)
    return schema


def _schemas():
    return {
        'CreateTokenRequest': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['role', 'name'],
            'properties': {
                'role': {'enum': list(ROLES)},
                'name': {
                    'type': 'string',
                    'pattern': NAME_PATTERN,
                    'description': 'The user id the token acts as (user, SUPER_ADMIN), or the '
                    "service's name (service).",
                },
            },
        },
        'Token': token_schema(),
        'CreatedToken': token_schema(
            token={'type': 'string', 'description': 'The token: shown this once only.'}
        ),
        'TokenList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['items', 'nextAfter'],
            'properties': {
                'items': {'type': 'array', 'items': ref('Token')},
                'nextAfter': {
                    'type': ['string', 'null'],
                    'description': 'Pass as `after` for the next page; null on the last page.',
                },
            },
        },
    }


def _paths():
    return {
        '/admin-api/ai/tokens': {
            'post': {
                'summary': 'Issue an API token of any role (SUPER_ADMIN). The answer is the only '
                'time the token is shown.',
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': ref('CreateTokenRequest')}},
                },
                'responses': dict(
                    {'201': json_response('Issued.', ref('CreatedToken'))},
                    **error_responses(400, 401, 403, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': 'The live API tokens, oldest first, masked (SUPER_ADMIN).',
                'parameters': [
                    query_param(
                        'after',
                        'Only tokens with a greater tokenId (the nextAfter of a page).',
                        {'type': 'string', 'pattern': '^[0-9]{1,18}$'},
                    ),
                    query_param(
                        'limit',
                        'At most this many (default %d).' % DEFAULT_LIMIT,
                        {'type': 'integer', 'minimum': 1, 'maximum': MAX_LIMIT},
                    ),
                ],
                'responses': dict(
                    {'200': json_response('One page.', ref('TokenList'))},
                    **error_responses(400, 401, 403, 503),
                ),
            },
        },
        '/admin-api/ai/tokens/{tokenId}': {
            'delete': {
                'summary': 'Revoke a token (SUPER_ADMIN): refused within a second everywhere.',
                'parameters': [
                    {
                        'name': 'tokenId',
                        'in': 'path',
                        'required': True,
                        'schema': {'type': 'string'},
                    }
                ],
                'responses': dict(
                    {'204': {'description': 'Revoked.'}},
                    **error_responses(401, 403, 404, 503),
                ),
            }
        },
    }
