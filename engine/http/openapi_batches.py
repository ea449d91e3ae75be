"""The provider batches part of the OpenAPI document (issue 22 item 5):
``GET /admin-api/ai/batches``, SUPER_ADMIN only."""

from .batch_views import BATCH_STATES, CURSOR_PATTERN, MAX_PAGE_SIZE
from .openapi import NULLABLE_TIME, TIME, _errors, _json, _page_params, _query_param, _ref
from .openapi_budgets import MONEY

_NULLABLE_TEXT = {'type': ['string', 'null']}
_COUNT = {'type': 'integer', 'minimum': 0}


def batch_schemas():
    view = {
        'batchId': {'type': 'string'},
        'provider': {'type': 'string', 'description': 'The route entry the batch went to.'},
        'model': {'type': 'string'},
        'state': {
            'enum': list(BATCH_STATES),
            'description': 'building (jobs chosen) -> uploaded (input file stored) -> submitted '
            '(the provider has the batch) -> ended (every job has its line); cancelling: every '
            'job of it was cancelled and the provider is told.',
        },
        'providerStatus': dict(
            _NULLABLE_TEXT, description='What the provider last said (validating, in_progress, …).'
        ),
        'providerBatchId': _NULLABLE_TEXT,
        'inputFileId': _NULLABLE_TEXT,
        'outputFileId': _NULLABLE_TEXT,
        'errorFileId': _NULLABLE_TEXT,
        'jobCount': _COUNT,
        'succeededCount': dict(_COUNT, description='Lines answered.'),
        'failedCount': dict(_COUNT, description='Lines that failed, expired or were cancelled.'),
        'cost': dict(MONEY, description='Cost of its answered lines, at the batch price.'),
        'pollCount': _COUNT,
        'nextPollAt': NULLABLE_TIME,
        'createdAt': TIME,
        'submittedAt': NULLABLE_TIME,
        'endedAt': NULLABLE_TIME,
    }
    return {
        'ProviderBatch': {
            'type': 'object',
            'additionalProperties': False,
            'required': list(view),
            'properties': view,
        },
        'ProviderBatchList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['items', 'nextCursor', 'limit'],
            'properties': {
                'items': {'type': 'array', 'items': _ref('ProviderBatch')},
                'nextCursor': {'type': ['string', 'null']},
                'limit': {'type': 'integer', 'minimum': 1, 'maximum': MAX_PAGE_SIZE},
            },
        },
    }


def batch_paths():
    return {
        '/admin-api/ai/batches': {
            'get': {
                'summary': 'Provider batches, newest first (SUPER_ADMIN).',
                'parameters': [
                    _query_param(
                        'state', 'Only batches in this state.', {'enum': list(BATCH_STATES)}
                    ),
                    *_page_params(
                        "MICROS.BATCH_ID, the last batch's createdAt in microseconds since 1970 "
                        '(UTC) and its id.',
                        CURSOR_PATTERN,
                    ),
                ],
                'responses': dict(
                    {'200': _json('One page.', _ref('ProviderBatchList'))},
                    **_errors(400, 401, 403, 503),
                ),
            }
        }
    }
