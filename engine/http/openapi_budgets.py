"""The budgets part of the OpenAPI document (issue 21 item 5): ``PUT/GET/DELETE
/admin-api/ai/budgets``, SUPER_ADMIN only."""

from ..gateway.budgets import ON_EXCEEDED, PERIODS, SCOPES
from .budget_views import MAX_SUBJECT
from .openapi import NOT_BLANK, NULLABLE_TIME, TIME, _errors, _json, _ref

MONEY = {
    'type': 'string',
    'pattern': r'^[0-9]{1,8}(\.[0-9]{1,6})?$',
    'description': 'A decimal amount in the units of the price table (ai_usage_log.cost).',
}


_BUDGET_ID = {'name': 'budgetId', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}


def budget_schemas(job_types):
    view = {
        'budgetId': {'type': 'string'},
        'scope': {'enum': list(SCOPES)},
        'subject': {'type': ['string', 'null'], 'description': 'The user id or job type.'},
        'period': {'enum': list(PERIODS)},
        'amount': MONEY,
        'onExceeded': {'enum': list(ON_EXCEEDED)},
        'spent': dict(MONEY, description="Spent in the current period (the calls' real cost)."),
        'reserved': dict(
            MONEY, description='Reserved by calls running now, at their maximum cost.'
        ),
        'remaining': dict(MONEY, description='amount - spent - reserved, never below 0.'),
        'resetsAt': dict(NULLABLE_TIME, description='End of the current period; null: total.'),
        'createdAt': TIME,
        'updatedAt': TIME,
    }
    return {
        'PutBudgetRequest': {
            'description': 'One budget per (scope, subject, period): a PUT of an existing one '
            'replaces its amount and onExceeded.',
            'oneOf': [
                _put_variant('global', {'enum': [None, '']}, 'No subject.'),
                _put_variant(
                    'user',
                    {'type': 'string', 'minLength': 1, 'maxLength': MAX_SUBJECT},
                    'The user id.',
                    pattern=NOT_BLANK,
                ),
                _put_variant('jobType', {'enum': list(job_types)}, 'A job type.'),
            ],
        },
        'Budget': {
            'type': 'object',
            'additionalProperties': False,
            'required': list(view),
            'properties': view,
        },
        'BudgetList': {
            'type': 'object',
            'additionalProperties': False,
            'required': ['items'],
            'properties': {'items': {'type': 'array', 'items': _ref('Budget')}},
        },
    }


def _put_variant(scope, subject, description, pattern=None):
    subject = dict(subject, description=description)
    if pattern:
        subject['pattern'] = pattern
    required = ['scope', 'period', 'amount'] + ([] if scope == 'global' else ['subject'])
    return {
        'type': 'object',
        'additionalProperties': False,
        'required': required,
        'properties': {
            'scope': {'const': scope},
            'subject': subject,
            'period': {'enum': list(PERIODS), 'description': 'UTC day, UTC month, or in total.'},
            'amount': MONEY,
            'onExceeded': {
                'enum': list(ON_EXCEEDED),
                'description': 'fail (default): a call that would pass the budget fails its job '
                'BUDGET_EXCEEDED; wait: the job waits until the period resets (a total budget '
                'never resets, so it fails).',
            },
        },
    }


def budget_paths():
    return {
        '/admin-api/ai/budgets': {
            'put': {
                'summary': 'Create or replace a budget in money (SUPER_ADMIN).',
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': _ref('PutBudgetRequest')}},
                },
                'responses': dict(
                    {
                        '200': _json('Replaced.', _ref('Budget')),
                        '201': _json('Created.', _ref('Budget')),
                    },
                    **_errors(400, 401, 403, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': "Every budget with its current period's spend, open reservations and "
                'reset time (SUPER_ADMIN).',
                'responses': dict(
                    {'200': _json('The budgets.', _ref('BudgetList'))}, **_errors(401, 403, 503)
                ),
            },
        },
        '/admin-api/ai/budgets/{budgetId}': {
            'delete': {
                'summary': 'Delete a budget (SUPER_ADMIN).',
                'parameters': [_BUDGET_ID],
                'responses': dict(
                    {
                        '204': {'description': 'Deleted.'},
                        '404': _json('BUDGET_NOT_FOUND: no such budget.', _ref('Error')),
                    },
                    **_errors(401, 403, 503),
                ),
            }
        },
    }
