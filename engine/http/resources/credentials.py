"""The credential resource: a user's own provider keys, registered (kept encrypted), listed
(masked) and deleted; the key itself never comes back, only its mask. With its part of the
OpenAPI document."""

import bottle

from ...core.errors import InvalidRequestError, UnknownCredentialError
from ...core.logs import log_event
from ...execution.credentials import MAX_KEY_CHARS, PROVIDER_PATTERN
from .. import parsing, views
from ..openapi import TIME, error_responses, json_response, ref
from ..replies import reply


class Credentials:
    """POST, GET /api/ai/credentials and DELETE /api/ai/credentials/{id}."""

    def __init__(self, runtime, access):
        self.runtime = runtime
        self.access = access
        self.max_body_bytes = runtime.config.max_body_bytes

    def routes(self):
        return (
            ('POST', '/api/ai/credentials', self.register_credential, True),
            ('GET', '/api/ai/credentials', self.list_credentials, True),
            ('DELETE', '/api/ai/credentials/<credential_id>', self.delete_credential, True),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        return {
            'CreateCredentialRequest': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['provider', 'apiKey'],
                'properties': {
                    'provider': {
                        'type': 'string',
                        'pattern': PROVIDER_PATTERN.pattern,
                        'examples': ['deepseek'],
                    },
                    'apiKey': {'type': 'string', 'maxLength': MAX_KEY_CHARS, 'pattern': r'^\S+$'},
                },
            },
            'Credential': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['credentialId', 'provider', 'maskedKey', 'createdAt'],
                'properties': {
                    'credentialId': {'type': 'string'},
                    'provider': {'type': 'string'},
                    'maskedKey': {'type': 'string'},
                    'createdAt': TIME,
                },
            },
            'CredentialList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['items'],
                'properties': {'items': {'type': 'array', 'items': ref('Credential')}},
            },
        }

    def register_credential(self):
        principal = self.access.caller()
        body = parsing.json_object(self.max_body_bytes)
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
        principal = self.access.caller()
        infos = self.runtime.ai.credential_store.list(principal.user_id)
        return reply({'items': [views.credential(info) for info in infos]})

    def delete_credential(self, credential_id):
        principal = self.access.caller()
        if not self.runtime.ai.credential_store.delete(principal.user_id, credential_id):
            raise UnknownCredentialError()
        log_event('credential.deleted', credential_id=credential_id, user_id=principal.user_id)
        return bottle.HTTPResponse(status=204)


def _paths():
    return {
        '/api/ai/credentials': {
            'post': {
                'summary': "Register one of the caller's provider keys (kept encrypted).",
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': ref('CreateCredentialRequest')}},
                },
                'responses': dict(
                    {
                        '201': json_response(
                            'Registered; only the mask is returned.', ref('Credential')
                        )
                    },
                    **error_responses(400, 401, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': "The caller's provider keys (masked).",
                'responses': dict(
                    {'200': json_response('The keys.', ref('CredentialList'))},
                    **error_responses(401, 503),
                ),
            },
        },
        '/api/ai/credentials/{credentialId}': {
            'delete': {
                'summary': "Delete one of the caller's provider keys.",
                'parameters': [
                    {
                        'name': 'credentialId',
                        'in': 'path',
                        'required': True,
                        'schema': {'type': 'string'},
                    }
                ],
                'responses': dict(
                    {
                        '204': {'description': 'Deleted.'},
                        '404': json_response(
                            'CREDENTIAL_NOT_FOUND: no such key of yours.', ref('Error')
                        ),
                    },
                    **error_responses(401, 503),
                ),
            }
        },
    }
