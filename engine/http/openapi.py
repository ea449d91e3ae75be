"""The OpenAPI 3.1 document served at ``/openapi.json``, assembled from the fragments each
resource declares beside its routes (engine/http/resources/): the common parts live here (the
error responses, the JobStatusResponse every job resource and webhook answers, the security
schemes, HEAD and OPTIONS of every path). The test client validates every response the suite sees
against it, so it cannot drift from what the API really answers."""

import re

from ..core.errors import public_error_codes
from ..core.registry import QUEUE_NAMES
from ..core.states import LEGACY_STATUS_TO_LIFECYCLE, Status
from .params import CURSOR_PATTERN, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

STATUSES = [status.value for status in Status]
STATUS_NAMES = STATUSES + list(LEGACY_STATUS_TO_LIFECYCLE)
TIME = {'type': 'string', 'format': 'date-time'}
NULLABLE_TIME = {'type': ['string', 'null'], 'format': 'date-time'}
NOT_BLANK = r'\S'  # a name the service accepts holds something besides white space

# What a status's codes mean where their names do not say it; the codes themselves come from the
# error classes (errors.public_error_codes), so a new error cannot be left out of the document.
ERROR_NOTES = {
    400: '`field` names the offending field when there is one',
    401: 'the bearer token is missing, malformed, unknown or revoked; a JWT or a '
    'publicAccessToken that fails a check (the message names it: exp, nbf, aud, iss, alg, '
    'signature)',
    403: 'the endpoint is for SUPER_ADMIN only, or not for a service key or a publicAccessToken',
    404: "also for another user's job (never 403 for a job); NOT_FOUND for an unknown path",
    408: 'the body did not arrive within AIJOB_REQUEST_TIMEOUT_MS',
    413: 'the body is over AIJOB_MAX_BODY_BYTES',
    422: 'the idempotency key was used before with a different request',
    429: 'see Retry-After; TOO_MANY_WAITERS: too many waitMs requests held at once',
    500: 'nothing else is said',
    503: 'see Retry-After; CREDENTIAL_STORAGE_UNAVAILABLE, WEBHOOKS_UNAVAILABLE: no credential '
    'master key is configured',
}
ERROR_CODES = {
    status: ', '.join(codes) + ('; ' + ERROR_NOTES[status] if status in ERROR_NOTES else '')
    for status, codes in public_error_codes().items()
}
ALL_ERROR_CODES = sorted({code for codes in public_error_codes().values() for code in codes})
RETRY_AFTER = {
    'Retry-After': {
        'description': 'Seconds to wait before trying again.',
        'schema': {'type': 'integer', 'minimum': 0},
    }
}

MONEY = {
    'type': 'string',
    'pattern': r'^[0-9]{1,8}(\.[0-9]{1,6})?$',
    'description': "A decimal amount in the units of the providers' prices (ai_usage_log.cost).",
}


def ref(name):
    return {'$ref': '#/components/schemas/%s' % name}


def json_response(description, schema, headers=None):
    response = {'description': description, 'content': {'application/json': {'schema': schema}}}
    if headers:
        response['headers'] = headers
    return response


def error_responses(*statuses):
    """The error answers of an operation. One that answers 401 answers 403 too: a service key
    or a publicAccessToken is refused (access.py) where only a user's own credential goes."""
    if 401 in statuses and 403 not in statuses:
        statuses += (403,)
    return {
        str(status): json_response(
            ERROR_CODES[status], ref('Error'), RETRY_AFTER if status in (429, 503) else None
        )
        for status in statuses + (500,)
    }


def path_param(name):
    return {'name': name, 'in': 'path', 'required': True, 'schema': {'type': 'string'}}


def job_id_param():
    return path_param('jobId')


def _list_pattern(names):
    """A pattern for a comma-separated list of ``names``, nothing else between the commas."""
    one = '(%s)' % '|'.join(re.escape(name) for name in names)
    return '^%s(,%s)*$' % (one, one)


def query_param(name, description, schema=None):
    return {
        'name': name,
        'in': 'query',
        'required': False,
        'description': description,
        'schema': schema or {'type': 'string', 'minLength': 1},  # an empty value is 400
    }


def page_params(cursor_format, cursor_pattern, max_page=MAX_PAGE_SIZE):
    """``limit`` and ``cursor``, the keyset paging of an admin list."""
    return [
        query_param(
            'limit',
            'Page size (default %d).' % DEFAULT_PAGE_SIZE,
            {'type': 'integer', 'minimum': 1, 'maximum': max_page},
        ),
        query_param(
            'cursor',
            'The nextCursor of the previous page: ' + cursor_format,
            {'type': 'string', 'pattern': cursor_pattern},
        ),
    ]


def job_list_params(user_filter):
    """The query parameters of a job list (engine/http/params.py)."""
    params = [
        query_param('jobType', 'Only this job type.'),
        query_param(
            'lifecycleStatus',
            'Comma-separated statuses: %s; legacy names %s are accepted.'
            % (', '.join(STATUSES), ', '.join(LEGACY_STATUS_TO_LIFECYCLE)),
            {'type': 'string', 'pattern': _list_pattern(STATUS_NAMES)},
        ),
        query_param('queueName', 'Only this queue.', {'enum': list(QUEUE_NAMES)}),
        query_param('userId', 'Only this user.'),
        query_param('createdFrom', 'Created at or after (RFC 3339).', TIME),
        query_param('createdTo', 'Created before (RFC 3339).', TIME),
        *page_params(
            "MICROS.JOB_ID, the last job's createdAt in microseconds since 1970 (UTC) and its id.",
            CURSOR_PATTERN,
        ),
    ]
    return [p for p in params if user_filter or p['name'] != 'userId']


def job_status_schema():
    """JobStatusResponse: what a job resource answers and a webhook delivers."""
    return {
        'type': 'object',
        'additionalProperties': False,
        'required': [
            'jobId',
            'jobType',
            'lifecycleStatus',
            'queueName',
            'priority',
            'progress',
            'createdAt',
        ],
        'properties': {
            'jobId': {'type': 'string'},
            'jobType': {'type': 'string'},
            'lifecycleStatus': {'enum': STATUSES},
            'queueName': {'type': 'string'},
            'priority': {'type': 'integer', 'minimum': 0, 'maximum': 100},
            'progress': {'type': 'integer', 'minimum': 0, 'maximum': 100},
            'createdAt': TIME,
            'startedAt': TIME,
            'finishedAt': TIME,
            'errorCode': {'type': 'string'},
            'publicErrorMessage': {'type': 'string', 'description': 'Safe to show a user.'},
            'batchId': {
                'type': 'string',
                'description': 'While the job waits in a provider batch (running): the batch, '
                'as GET /admin-api/ai/batches names it.',
            },
            'result': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['artifactCount', 'artifacts'],
                'properties': {
                    'artifactCount': {'type': 'integer', 'minimum': 0},
                    'artifacts': {'type': 'array', 'items': ref('ArtifactRef')},
                    'provider': {
                        'type': 'string',
                        'description': 'The provider whose answer the result is.',
                    },
                    'model': {
                        'type': 'string',
                        'description': 'The model that produced the result (after any '
                        'fallback along its route).',
                    },
                },
            },
        },
    }


def common_schemas():
    """The schemas every part of the document refers to."""
    return {
        'JobStatusResponse': job_status_schema(),
        'ArtifactRef': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['artifactType', 'artifactId'],
            'properties': {'artifactType': {'type': 'string'}, 'artifactId': {'type': 'string'}},
        },
        'Checks': {'type': 'object', 'additionalProperties': {'enum': ['ok', 'unavailable']}},
        'Error': {
            'type': 'object',
            'required': ['error'],
            'properties': {
                'error': {
                    'type': 'object',
                    'additionalProperties': False,
                    'required': ['code', 'message'],
                    'properties': {
                        'code': {'type': 'string', 'enum': ALL_ERROR_CODES},
                        'message': {'type': 'string'},
                        'field': {'type': 'string'},
                    },
                },
                'checks': ref('Checks'),
            },
        },
    }


HTTP_METHODS = ('get', 'put', 'post', 'delete', 'patch')


def allowed_methods(operations):
    """The Allow header of a path with these operations: its methods, HEAD with GET, OPTIONS."""
    methods = [m.upper() for m in HTTP_METHODS if m in operations]
    if 'GET' in methods:
        methods.append('HEAD')
    return ', '.join(methods + ['OPTIONS'])


def with_head_and_options(operations):
    """Every path also answers HEAD (where it answers GET: the GET's statuses and headers, no
    body) and OPTIONS (204 with Allow, for anyone: it reveals nothing the document does not)."""
    operations = dict(operations)
    if 'get' in operations:
        operations['head'] = _head_of(operations['get'])
    operations['options'] = {
        'summary': 'The methods this path answers.',
        'parameters': _path_parameters(operations),
        'security': [],
        'responses': {
            '204': {
                'description': 'No content; Allow lists the methods.',
                'headers': {
                    'Allow': {
                        'schema': {'type': 'string', 'const': allowed_methods(operations)},
                    }
                },
            }
        },
    }
    return operations


def _path_parameters(operations):
    """The path's own parameters ({jobId}, ...), as its operations declare them."""
    found = {}
    for method in HTTP_METHODS:
        for parameter in operations.get(method, {}).get('parameters', ()):
            if parameter.get('in') == 'path':
                found.setdefault(parameter['name'], parameter)
    return list(found.values())


def _head_of(get):
    head = {key: value for key, value in get.items() if key != 'responses'}
    head['summary'] = 'As GET, headers only.'
    head['responses'] = {
        status: {key: value for key, value in response.items() if key != 'content'}
        for status, response in get['responses'].items()
    }
    return head


def build_document(resources):
    """The document of these resources, in their order: each declares its ``paths()`` and the
    ``schemas()`` it owns, and may declare ``security_schemes()`` of its own (the dashboard's
    session cookie)."""
    paths, schemas = {}, common_schemas()
    schemes = {
        'bearerAuth': {
            'type': 'http',
            'scheme': 'bearer',
            'description': 'An API token (a user, a service key, SUPER_ADMIN), a JWT the '
            "application signed for its user (AIJOB_JWT_*), or a job's publicAccessToken.",
        }
    }
    for resource in resources:
        paths.update(resource.paths())
        schemas.update(resource.schemas())
        schemes.update(getattr(resource, 'security_schemes', dict)())
    paths = {path: with_head_and_options(operations) for path, operations in paths.items()}
    return {
        'openapi': '3.1.0',
        'info': {
            'title': 'aijob',
            'version': '1',
            'description': 'Durable AI jobs: create, poll, cancel; admin list and retry. '
            'Every error is {"error": {"code", "message"}}.',
        },
        'security': [{'bearerAuth': []}],
        'paths': paths,
        'components': {
            'securitySchemes': schemes,
            'schemas': schemas,
        },
    }
