"""Budgets in money as the admin API shows them, and the checks of what an admin sends
(``PUT/GET/DELETE /admin-api/ai/budgets``; engine/gateway/budgets.py keeps them). Plain values
in and out; the routes are in app.py."""

import re
from decimal import Decimal

from ..core.errors import BudgetNotFoundError, InvalidRequestError, UnknownJobTypeError
from ..gateway.budgets import ON_EXCEEDED, PERIODS, SCOPES, from_micros, period_reset
from .views import iso

BUDGET_FIELDS = ('scope', 'subject', 'period', 'amount', 'onExceeded')
# DECIMAL(14, 6): at most 8 digits before the point and 6 after it, never negative.
AMOUNT = re.compile(r'^[0-9]{1,8}(\.[0-9]{1,6})?$')
MAX_SUBJECT = 64


class BudgetEndpoints:
    """What the budget routes do, over the runtime's Budgets."""

    def __init__(self, runtime):
        self.budgets = runtime.budgets
        self.registry = runtime.registry

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
