"""The OpenAPI 3.1 document served at ``/openapi.json``: every endpoint, parameter, response and
error code. The test client validates every response the suite sees against it, so it cannot
drift from what the API really answers."""

import re

from ..core import history
from ..core.errors import public_error_codes
from ..core.lifecycle import LEGACY_STATUS_TO_LIFECYCLE, Status
from ..core.registry import QUEUE_NAMES, first_error
from ..execution.credentials import MAX_KEY_CHARS, PROVIDER_PATTERN
from . import history_view
from .params import CURSOR_PATTERN, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

STATUSES = [status.value for status in Status]
STATUS_NAMES = STATUSES + list(LEGACY_STATUS_TO_LIFECYCLE)
TIME = {'type': 'string', 'format': 'date-time'}
NULLABLE_TIME = {'type': ['string', 'null'], 'format': 'date-time'}
USER_KEY_MODE = 'user_deepseek_key'
NOT_BLANK = r'\S'  # a name the service accepts holds something besides white space

# What a status's codes mean where their names do not say it; the codes themselves come from the
# error classes (errors.public_error_codes), so a new error cannot be left out of the document.
ERROR_NOTES = {
    400: '`field` names the offending field when there is one',
    401: 'the bearer token is missing, malformed, unknown or revoked',
    403: 'the endpoint is for SUPER_ADMIN only',
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


def _ref(name):
    return {'$ref': '#/components/schemas/%s' % name}


def _json(description, schema, headers=None):
    response = {'description': description, 'content': {'application/json': {'schema': schema}}}
    if headers:
        response['headers'] = headers
    return response


def _errors(*statuses):
    return {
        str(status): _json(
            ERROR_CODES[status], _ref('Error'), RETRY_AFTER if status in (429, 503) else None
        )
        for status in statuses + (500,)
    }


def _job_id_param():
    return {'name': 'jobId', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}


def _list_pattern(names):
    """A pattern for a comma-separated list of ``names``, nothing else between the commas."""
    one = '(%s)' % '|'.join(re.escape(name) for name in names)
    return '^%s(,%s)*$' % (one, one)


def _query_param(name, description, schema=None):
    return {
        'name': name,
        'in': 'query',
        'required': False,
        'description': description,
        'schema': schema or {'type': 'string', 'minLength': 1},  # an empty value is 400
    }


def _page_params(cursor_format, cursor_pattern, max_page=MAX_PAGE_SIZE):
    """``limit`` and ``cursor``, the keyset paging of an admin list."""
    return [
        _query_param(
            'limit',
            'Page size (default %d).' % DEFAULT_PAGE_SIZE,
            {'type': 'integer', 'minimum': 1, 'maximum': max_page},
        ),
        _query_param(
            'cursor',
            'The nextCursor of the previous page: ' + cursor_format,
            {'type': 'string', 'pattern': cursor_pattern},
        ),
    ]


def _list_params(user_filter):
    """The query parameters of a job list (engine/http/params.py)."""
    params = [
        _query_param('jobType', 'Only this job type.'),
        _query_param(
            'lifecycleStatus',
            'Comma-separated statuses: %s; legacy names %s are accepted.'
            % (', '.join(STATUSES), ', '.join(LEGACY_STATUS_TO_LIFECYCLE)),
            {'type': 'string', 'pattern': _list_pattern(STATUS_NAMES)},
        ),
        _query_param('queueName', 'Only this queue.', {'enum': list(QUEUE_NAMES)}),
        _query_param('userId', 'Only this user.'),
        _query_param('createdFrom', 'Created at or after (RFC 3339).', TIME),
        _query_param('createdTo', 'Created before (RFC 3339).', TIME),
        *_page_params(
            "MICROS.JOB_ID, the last job's createdAt in microseconds since 1970 (UTC) and its id.",
            CURSOR_PATTERN,
        ),
    ]
    return [p for p in params if user_filter or p['name'] != 'userId']


def _schemas(definitions, prompt_versions):
    job_status = {
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
                    'artifacts': {'type': 'array', 'items': _ref('ArtifactRef')},
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
    admin_job = dict(
        job_status,
        properties=dict(
            job_status['properties'],
            **{
                'userId': {'type': 'string'},
                'targetType': {'type': 'string'},
                'targetId': {'type': 'string'},
                'attemptNo': {'type': 'integer'},
                'retryCount': {'type': 'integer'},
                'maxRetryCount': {'type': 'integer'},
                'internalErrorMessage': {
                    'type': ['string', 'null'],
                    'description': 'SUPER_ADMIN only (contracts §7.4).',
                },
                'retryOfJobId': {'type': ['string', 'null']},
                'cancelRequestedAt': NULLABLE_TIME,
                'updatedAt': TIME,
            },
        ),
        required=job_status['required'] + ['userId', 'internalErrorMessage'],
    )
    return {
        'JobStatusResponse': job_status,
        'AdminJob': admin_job,
        'ArtifactRef': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['artifactType', 'artifactId'],
            'properties': {'artifactType': {'type': 'string'}, 'artifactId': {'type': 'string'}},
        },
        'CreateJobRequest': _create_job_request(definitions, prompt_versions),
        'JobEvent': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['id', 'jobId', 'kind', 'attemptNo', 'detail', 'at'],
            'properties': {
                'id': {
                    'type': 'integer',
                    'description': 'Increases across all jobs: page and resume after it.',
                },
                'jobId': {'type': 'string'},
                'kind': {
                    'enum': list(history.KINDS),
                    'description': 'README "Job history". `deferred`: a guard (a provider rate '
                    'limit, a budget that waits) handed the job back, still running with no '
                    'worker, until its wake time (detail: reason, delayMs); no retry spent.',
                },
                'attemptNo': {
                    'type': 'integer',
                    'minimum': 0,
                    'description': "The job's lock count when it happened (0: never locked).",
                },
                'detail': {
                    'type': 'object',
                    'description': 'Per kind (README "Job history"). worker, dispatcher, '
                    'internalMessage: SUPER_ADMIN only.',
                },
                'at': TIME,
            },
        },
        'JobEventList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['jobId', 'lifecycleStatus', 'events', 'nextAfter'],
            'properties': {
                'jobId': {'type': 'string'},
                'lifecycleStatus': {'enum': STATUSES},
                'events': {'type': 'array', 'items': _ref('JobEvent')},
                'nextAfter': {
                    'type': ['integer', 'null'],
                    'description': 'The last event id when more may follow (pass it as after).',
                },
            },
        },
        'ArtifactList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['jobId', 'lifecycleStatus', 'artifacts'],
            'properties': {
                'jobId': {'type': 'string'},
                'lifecycleStatus': {'enum': STATUSES},
                'artifacts': {
                    'type': 'array',
                    'items': {
                        'type': 'object',
                        'additionalProperties': False,
                        'required': ['artifactType', 'artifactId', 'ordinal', 'content'],
                        'properties': {
                            'artifactType': {'type': 'string'},
                            'artifactId': {'type': 'string'},
                            'ordinal': {'type': 'integer'},
                            'content': {
                                'description': 'The artifact JSON; null when a '
                                'business projector keeps it elsewhere.'
                            },
                        },
                    },
                },
            },
        },
        'JobList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['items', 'nextCursor', 'limit'],
            'properties': {
                'items': {'type': 'array', 'items': _ref('JobStatusResponse')},
                'nextCursor': {
                    'type': ['string', 'null'],
                    'description': 'Pass as `cursor` for the next page; null on the last page.',
                },
                'limit': {'type': 'integer'},
            },
        },
        'AdminJobList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['items', 'nextCursor', 'limit'],
            'properties': {
                'items': {'type': 'array', 'items': _ref('AdminJob')},
                'nextCursor': {
                    'type': ['string', 'null'],
                    'description': 'Pass as `cursor` for the next page; null on the last page.',
                },
                'limit': {'type': 'integer'},
            },
        },
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
            'properties': {'items': {'type': 'array', 'items': _ref('Credential')}},
        },
        'UsageTotals': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['since', 'until', 'groupBy', 'totals'],
            'properties': {
                'since': TIME,
                'until': TIME,
                'groupBy': {'enum': ['user', 'jobType']},
                'totals': {
                    'type': 'array',
                    'items': {
                        'type': 'object',
                        'additionalProperties': False,
                        'required': ['calls', 'promptTokens', 'completionTokens', 'cost', 'errors'],
                        'properties': {
                            'userId': {'type': 'string'},
                            'jobType': {'type': 'string'},
                            'calls': {'type': 'integer'},
                            'promptTokens': {'type': 'integer'},
                            'completionTokens': {'type': 'integer'},
                            'cost': {'type': 'string', 'description': 'Decimal, as text.'},
                            'errors': {'type': 'integer'},
                        },
                    },
                },
            },
        },
        'Health': {
            'type': 'object',
            'required': ['status'],
            'properties': {'status': {'enum': ['ok', 'ready']}, 'checks': _ref('Checks')},
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
                'checks': _ref('Checks'),
            },
        },
    }


def _create_job_request(definitions, prompt_versions):
    """One schema per job type (``oneOf`` on ``jobType``): its input schema and the credential
    modes it allows are part of the contract, so a body the document allows is one the server
    accepts. Optional fields may be null (the same as absent)."""
    return {
        'oneOf': [_create_one(d, prompt_versions(d)) for d in definitions],
        'description': 'Idempotency: idempotencyKey or the Idempotency-Key header; when both are '
        'given they must be equal.',
    }


def _create_one(definition, prompt_versions):
    text = {'type': 'string', 'pattern': NOT_BLANK}
    nullable = lambda schema: dict(schema, type=[schema['type'], 'null'])  # noqa: E731
    required = ['jobType', 'targetType', 'targetId']
    schema = definition.input.schema
    if schema is not None and first_error(schema, {}) is not None:
        required.append('input')  # the default {} would not do
    return {
        'type': 'object',
        'additionalProperties': False,
        'required': required,
        'properties': {
            'jobType': {'const': definition.job_type},
            'targetType': dict(text, maxLength=64),
            'targetId': dict(text, maxLength=128),
            'input': dict(
                definition.input.schema or {'type': 'object'},
                description="The job type's input (default {}).",
            ),
            'idempotencyKey': nullable(dict(text, maxLength=255)),
            'webhookUrl': {
                'type': ['string', 'null'],
                'format': 'uri',
                'pattern': '^https?://',
                'maxLength': 2048,
                'description': 'POSTed the terminal status, signed with the secret of '
                'GET /api/ai/webhooks/job-secret; https, public addresses only '
                '(WEBHOOK_URL_REFUSED otherwise).',
            },
            'overrides': _overrides(definition, prompt_versions, text, nullable),
        },
    }


def _overrides(definition, prompt_versions, text, nullable):
    """What a job may override; ``credentialId`` names a stored key, and only with the
    user-key mode (which the job type must allow)."""
    modes = list(definition.credential.allowed_modes)
    schema = {
        'type': ['object', 'null'],
        'additionalProperties': False,
        'properties': {
            'priority': {'type': ['integer', 'null'], 'minimum': 0, 'maximum': 100},
            'credentialMode': {'enum': modes + [None]},
            'credentialId': {'type': 'null'},
            'promptVersion': nullable(dict(text, maxLength=32))
            if prompt_versions is None
            else {'enum': prompt_versions + [None]},
            'outputSchemaVersion': nullable(dict(text, maxLength=32)),
            'noCache': {
                'type': ['boolean', 'null'],
                'description': 'true: the response cache (a job type that opts in) is neither '
                'read nor written for this job.',
            },
        },
    }
    if USER_KEY_MODE in modes:
        user_mode = {'properties': {'credentialMode': {'const': USER_KEY_MODE}}}
        if definition.credential.default_mode != USER_KEY_MODE:
            user_mode['required'] = ['credentialMode']
        schema['if'] = user_mode
        schema['then'] = {
            'required': ['credentialId'],
            'properties': {'credentialId': dict(text, maxLength=36)},
        }
        schema['else'] = {'properties': {'credentialId': {'type': 'null'}}}
        schema['properties']['credentialId'] = {'type': ['string', 'null']}
    return schema


def _job_paths():
    job_id = _job_id_param()
    return {
        '/api/ai/jobs': {
            'get': {
                'summary': "The caller's own jobs, newest first (the admin list's filters, "
                'without userId).',
                'parameters': _list_params(user_filter=False),
                'responses': dict(
                    {'200': _json('One page.', _ref('JobList'))}, **_errors(400, 401, 503)
                ),
            },
            'post': {
                'summary': 'Create a job for the caller (idempotent with a key).',
                'parameters': [
                    {
                        'name': 'Idempotency-Key',
                        'in': 'header',
                        'required': False,
                        'schema': {'type': 'string', 'maxLength': 255},
                    }
                ],
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': _ref('CreateJobRequest')}},
                },
                'responses': dict(
                    {
                        '201': _json('Created.', _ref('JobStatusResponse')),
                        '200': _json(
                            'Idempotent replay: the job created earlier with this key.',
                            _ref('JobStatusResponse'),
                        ),
                    },
                    **_errors(400, 401, 408, 413, 415, 422, 429, 503),
                ),
            },
        },
        '/api/ai/jobs/{jobId}': {
            'get': {
                'summary': 'Job status (owner or SUPER_ADMIN). Poll with If-None-Match and waitMs.',
                'parameters': [
                    job_id,
                    _query_param(
                        'waitMs',
                        'Wait up to this long (max 30000) for the job to change from what '
                        'If-None-Match names (or from its state now); answers at once when it '
                        'does.',
                        {'type': 'integer', 'minimum': 0, 'maximum': 30000},
                    ),
                    {
                        'name': 'If-None-Match',
                        'in': 'header',
                        'required': False,
                        'schema': {'type': 'string'},
                    },
                ],
                'responses': dict(
                    {
                        '200': _json(
                            'The job.',
                            _ref('JobStatusResponse'),
                            {'ETag': {'schema': {'type': 'string'}}},
                        ),
                        '304': {'description': 'Unchanged since the ETag in If-None-Match.'},
                    },
                    **_errors(400, 401, 404, 429, 503),
                ),
            }
        },
        '/api/ai/jobs/{jobId}/artifacts': {
            'get': {
                'summary': 'The artifact contents of a job, in ordinal order (owner or '
                'SUPER_ADMIN).',
                'parameters': [job_id],
                'responses': dict(
                    {'200': _json('The artifacts.', _ref('ArtifactList'))}, **_errors(401, 404, 503)
                ),
            }
        },
        '/api/ai/jobs/{jobId}/events': {
            'get': {
                'summary': "The job's transition history, oldest first (owner: public view; "
                'SUPER_ADMIN: everything).',
                'parameters': [
                    job_id,
                    _query_param(
                        'after',
                        'Only events with a greater id.',
                        {'type': 'integer', 'minimum': 0},
                    ),
                    _query_param(
                        'limit',
                        'At most this many events (default %d).' % history_view.DEFAULT_LIMIT,
                        {'type': 'integer', 'minimum': 1, 'maximum': history_view.MAX_LIMIT},
                    ),
                ],
                'responses': dict(
                    {'200': _json('The events.', _ref('JobEventList'))},
                    **_errors(400, 401, 404, 503),
                ),
            }
        },
        '/api/ai/jobs/{jobId}/cancel': {
            'post': {
                'summary': 'Cancel a job (owner only).',
                'parameters': [job_id],
                'responses': dict(
                    {
                        '200': _json(
                            'Cancelled at once, lifecycleStatus cancelled (it was queued, or '
                            'running with no worker holding it: deferred, or parked in a '
                            'provider batch).',
                            _ref('JobStatusResponse'),
                        ),
                        '202': _json(
                            'Cancel requested, lifecycleStatus running: a worker holds the job '
                            'and stops it shortly.',
                            _ref('JobStatusResponse'),
                        ),
                    },
                    **_errors(401, 404, 409, 503),
                ),
            }
        },
    }


def _admin_paths():
    return {
        '/admin-api/ai/jobs': {
            'get': {
                'summary': 'List jobs, newest first (SUPER_ADMIN).',
                'parameters': _list_params(user_filter=True),
                'responses': dict(
                    {'200': _json('One page.', _ref('AdminJobList'))}, **_errors(400, 401, 403, 503)
                ),
            }
        },
        '/admin-api/ai/jobs/{jobId}/retry': {
            'post': {
                'summary': 'Retry a failed or cancelled job as a new job (SUPER_ADMIN).',
                'parameters': [_job_id_param()],
                'responses': dict(
                    {'201': _json('The new job, linked by retryOfJobId.', _ref('AdminJob'))},
                    **_errors(401, 403, 404, 409, 429, 503),
                ),
            }
        },
    }


def _credential_and_usage_paths():
    return {
        '/api/ai/credentials': {
            'post': {
                'summary': "Register one of the caller's provider keys (kept encrypted).",
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': _ref('CreateCredentialRequest')}},
                },
                'responses': dict(
                    {'201': _json('Registered; only the mask is returned.', _ref('Credential'))},
                    **_errors(400, 401, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': "The caller's provider keys (masked).",
                'responses': dict(
                    {'200': _json('The keys.', _ref('CredentialList'))}, **_errors(401, 503)
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
                        '404': _json('CREDENTIAL_NOT_FOUND: no such key of yours.', _ref('Error')),
                    },
                    **_errors(401, 503),
                ),
            }
        },
        '/admin-api/ai/usage': {
            'get': {
                'summary': 'Provider usage totals per user or per job type (SUPER_ADMIN).',
                'parameters': [
                    _query_param(
                        'since',
                        'From (inclusive, RFC 3339); default until minus 24 h. Not before until: '
                        'an empty range (no totals).',
                        TIME,
                    ),
                    _query_param('until', 'To (exclusive, RFC 3339); default now.', TIME),
                    _query_param(
                        'groupBy', 'user (default) or jobType.', {'enum': ['user', 'jobType']}
                    ),
                ],
                'responses': dict(
                    {'200': _json('Totals, costliest first.', _ref('UsageTotals'))},
                    **_errors(400, 401, 403, 503),
                ),
            }
        },
    }


def _operations_paths():
    return {
        '/healthz': {
            'get': {
                'summary': 'The process is alive.',
                'security': [],
                'responses': dict({'200': _json('Alive.', _ref('Health'))}, **_errors()),
            }
        },
        '/readyz': {
            'get': {
                'summary': 'The database answers a query and the queue takes a write on every '
                'shard (a read-only replica, a wrong node or a lost master is not ready).',
                'security': [],
                'responses': dict(
                    {
                        '200': _json('Ready.', _ref('Health')),
                        '503': _json(
                            'NOT_READY: a dependency is unreachable or refuses writes; `checks` '
                            'says which.',
                            _ref('Error'),
                            RETRY_AFTER,
                        ),
                    },
                    **{'500': _errors()['500']},
                ),
            }
        },
        '/metrics': {
            'get': {
                'summary': 'Prometheus metrics, text exposition format (SUPER_ADMIN, or the '
                'AIJOB_METRICS_TOKEN bearer).',
                'responses': dict(
                    {
                        '200': {
                            'description': 'The scrape.',
                            'content': {'text/plain': {'schema': {'type': 'string'}}},
                        }
                    },
                    **_errors(401, 403, 503),
                ),
            }
        },
        '/openapi.json': {
            'get': {
                'summary': 'This document.',
                'security': [],
                'responses': dict({'200': _json('OpenAPI 3.1.', {'type': 'object'})}, **_errors()),
            }
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


def build_openapi(registry, extra_paths=None, extra_schemas=None, prompt_versions=None):
    """The document for ``registry``'s API-creatable job types; ``prompt_versions(definition)``
    (None: any) lists the promptVersion values each may name on this server."""
    definitions = sorted(
        (d for d in registry.get_all() if d.api_creatable), key=lambda d: d.job_type
    )
    paths = {}
    for part in (
        _job_paths(),
        _admin_paths(),
        _credential_and_usage_paths(),
        _operations_paths(),
        extra_paths or {},
    ):
        paths.update(part)
    paths = {path: with_head_and_options(operations) for path, operations in paths.items()}
    schemas = _schemas(definitions, prompt_versions or (lambda definition: None))
    schemas.update(extra_schemas or {})
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
            'securitySchemes': {
                'bearerAuth': {'type': 'http', 'scheme': 'bearer'},
                'dashboardSession': {'type': 'apiKey', 'in': 'cookie', 'name': 'aijob_session'},
            },
            'schemas': schemas,
        },
    }
