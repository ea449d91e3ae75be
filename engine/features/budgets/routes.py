"""The budget resource (SUPER_ADMIN): budgets in money per user, job type or in total
(``PUT/GET/DELETE /admin-api/ai/budgets``; ledger.py keeps and enforces them), the checks of
what an admin sends, the shape the API shows, and their part of the OpenAPI document."""

import re
from decimal import Decimal

import bottle

from ...core.errors import BudgetNotFoundError, InvalidRequestError, UnknownJobTypeError
from ...core.logs import log_event
from ...http import parsing
from ...http.openapi import (
    MONEY,
    NOT_BLANK,
    NULLABLE_TIME,
    TIME,
    error_responses,
    json_response,
    path_param,
    ref,
)
from ...http.replies import reply
from ...http.views import iso
from .ledger import ON_EXCEEDED, PERIODS, SCOPES, from_micros, period_reset

BUDGET_FIELDS = ('scope', 'subject', 'period', 'amount', 'onExceeded')
# DECIMAL(14, 6): at most 8 digits before the point and 6 after it, never negative.
AMOUNT = re.compile(r'^[0-9]{1,8}(\.[0-9]{1,6})?$')
MAX_SUBJECT = 64


class BudgetRoutes:
    """The budget routes, over the budgets ledger."""

    def __init__(self, runtime, access):
        self.access = access
        self.max_body_bytes = runtime.config.max_body_bytes
        self.budgets = runtime.features['budgets']
        self.registry = runtime.registry

    def routes(self):
        return (
            ('PUT', '/admin-api/ai/budgets', self.admin_put_budget, True),
            ('GET', '/admin-api/ai/budgets', self.admin_list_budgets, True),
            ('DELETE', '/admin-api/ai/budgets/<budget_id>', self.admin_delete_budget, True),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        job_types = sorted(d.job_type for d in self.registry.get_all())
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
                'properties': {'items': {'type': 'array', 'items': ref('Budget')}},
            },
        }

    # -- the routes
    def admin_put_budget(self):
        self.access.admin()
        view, created = self.put(parsing.json_object(self.max_body_bytes))
        log_event('budget.saved', budget_id=view['budgetId'], created=created)
        return reply(view, 201 if created else 200)

    def admin_list_budgets(self):
        self.access.admin()
        return reply(self.list())

    def admin_delete_budget(self, budget_id):
        self.access.admin()
        self.delete(budget_id)
        log_event('budget.deleted', budget_id=budget_id)
        return bottle.HTTPResponse(status=204)

    # -- what the routes do, in plain values

    def put(self, body):
        """Create or replace the budget of (scope, subject, period); (view, created)."""
        scope, subject, period, amount, on_exceeded = self.validate(body)
        row, created = self.budgets.put(scope, subject, period, amount, on_exceeded)
        view = next(v for v in self.list()['items'] if v['budgetId'] == row.id)
        return view, created

    def list(self):
        return {'items': [budget_view(*listed) for listed in self.budgets.listing()]}

    def delete(self, budget_id):
        if not self.budgets.delete(budget_id):
            raise BudgetNotFoundError()

    def validate(self, body):
        unknown = sorted(set(body) - set(BUDGET_FIELDS))
        if unknown:
            raise InvalidRequestError(
                '%s is not a budget field (allowed: %s)' % (unknown[0], ', '.join(BUDGET_FIELDS)),
                field=unknown[0],
            )
        scope = _choice(body, 'scope', SCOPES)
        period = _choice(body, 'period', PERIODS)
        # wait on a total budget fails all the same: the period never resets.
        on_exceeded = _choice(body, 'onExceeded', ON_EXCEEDED, default='fail')
        return scope, self._subject(body, scope), period, _amount(body), on_exceeded

    def _subject(self, body, scope):
        subject = body.get('subject')
        if scope == 'global':
            if subject not in (None, ''):
                raise InvalidRequestError('a global budget has no subject', field='subject')
            return ''
        blank = not isinstance(subject, str) or not re.search(r'\S', subject)
        if blank or len(subject) > MAX_SUBJECT:
            raise InvalidRequestError(
                'subject must be the %s, a non-empty string of at most %d characters'
                % ('user id' if scope == 'user' else 'job type', MAX_SUBJECT),
                field='subject',
            )
        if scope == 'jobType':
            try:
                self.registry.get(subject)
            except UnknownJobTypeError:
                raise InvalidRequestError(
                    'subject %r is not a known jobType' % subject, field='subject'
                ) from None
        return subject


def _choice(body, name, allowed, default=None):
    value = body.get(name, default)
    if value not in allowed:
        raise InvalidRequestError('%s must be one of %s' % (name, ', '.join(allowed)), field=name)
    return value


def _amount(body):
    value = body.get('amount')
    if not isinstance(value, str) or not AMOUNT.match(value):
        raise InvalidRequestError(
            'amount must be a decimal string, 0 or more, with at most 8 digits before the point '
            'and 6 after it (e.g. "25.50")',
            field='amount',
        )
    return Decimal(value)


def budget_view(budget, row, spent, reserved, now):
    """One budget with its current period's spend, open reservations and reset time."""
    reset = period_reset(budget.period, now)
    return {
        'budgetId': budget.id,
        'scope': budget.scope,
        'subject': budget.subject or None,
        'period': budget.period,
        'amount': str(from_micros(budget.amount_micros)),
        'onExceeded': budget.on_exceeded,
        'spent': str(from_micros(spent)),
        'reserved': str(from_micros(reserved)),
        'remaining': str(from_micros(max(0, budget.amount_micros - spent - reserved))),
        'resetsAt': iso(reset) if reset is not None else None,
        'createdAt': iso(row.created_at),
        'updatedAt': iso(row.updated_at),
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


def _paths():
    return {
        '/admin-api/ai/budgets': {
            'put': {
                'summary': 'Create or replace a budget in money (SUPER_ADMIN).',
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': ref('PutBudgetRequest')}},
                },
                'responses': dict(
                    {
                        '200': json_response('Replaced.', ref('Budget')),
                        '201': json_response('Created.', ref('Budget')),
                    },
                    **error_responses(400, 401, 403, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': "Every budget with its current period's spend, open reservations and "
                'reset time (SUPER_ADMIN).',
                'responses': dict(
                    {'200': json_response('The budgets.', ref('BudgetList'))},
                    **error_responses(401, 403, 503),
                ),
            },
        },
        '/admin-api/ai/budgets/{budgetId}': {
            'delete': {
                'summary': 'Delete a budget (SUPER_ADMIN).',
                'parameters': [path_param('budgetId')],
                'responses': dict(
                    {
                        '204': {'description': 'Deleted.'},
                        '404': json_response('BUDGET_NOT_FOUND: no such budget.', ref('Error')),
                    },
                    **error_responses(401, 403, 503),
                ),
            }
        },
    }
