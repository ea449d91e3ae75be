"""The usage resource (SUPER_ADMIN): provider usage totals per user or per job type over a time
range, with its part of the OpenAPI document."""

import datetime

from ...core.errors import InvalidRequestError
from ...execution.usage import usage_totals
from .. import params as listing
from .. import parsing, views
from ..openapi import TIME, error_responses, json_response, query_param, ref
from ..replies import reply

USAGE_GROUPS = {'user': 'user', 'jobType': 'job_type'}


class Usage:
    """GET /admin-api/ai/usage."""

    def __init__(self, runtime, access):
        self.store = runtime.store
        self.access = access

    def routes(self):
        return (('GET', '/admin-api/ai/usage', self.admin_usage, True),)

    def paths(self):
        return _paths()

    def schemas(self):
        return {
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
                            'required': [
                                'calls',
                                'promptTokens',
                                'completionTokens',
                                'cost',
                                'errors',
                            ],
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
        }

    def admin_usage(self):
        self.access.admin()
        since, until, group_by = usage_query(parsing.query(), self.store.clock())
        totals = usage_totals(since, until, USAGE_GROUPS[group_by])
        return reply(
            {
                'since': views.iso(since),
                'until': views.iso(until),
                'groupBy': group_by,
                'totals': totals,
            }
        )


def usage_query(params, now):
    """(since, until, groupBy) of GET /admin-api/ai/usage; by default the last 24 hours."""
    unknown = sorted(set(params) - {'since', 'until', 'groupBy'})
    if unknown:
        raise InvalidRequestError(
            'unknown query parameter %s (allowed: since, until, groupBy)' % unknown[0],
            field=unknown[0],
        )
    group_by = params.get('groupBy') or 'user'
    if group_by not in USAGE_GROUPS:
        raise InvalidRequestError('groupBy must be user or jobType', field='groupBy')
    until = listing.parse_rfc3339(params.get('until'), 'until') or now
    since = listing.parse_rfc3339(params.get('since'), 'since') or _day_before(until)
    return since, until, group_by  # since >= until: an empty range, no totals


def _day_before(until):
    """The default ``since``: a day before ``until``, or the earliest time there is when
    ``until`` is within a day of it (``until=0001-01-01T00:00:00Z`` is a valid, empty range)."""
    if until - datetime.datetime.min.replace(tzinfo=until.tzinfo) < datetime.timedelta(days=1):
        return datetime.datetime.min.replace(tzinfo=until.tzinfo)
    return until - datetime.timedelta(days=1)


def _paths():
    return {
        '/admin-api/ai/usage': {
            'get': {
                'summary': 'Provider usage totals per user or per job type (SUPER_ADMIN).',
                'parameters': [
                    query_param(
                        'since',
                        'From (inclusive, RFC 3339); default until minus 24 h. Not before until: '
                        'an empty range (no totals).',
                        TIME,
                    ),
                    query_param('until', 'To (exclusive, RFC 3339); default now.', TIME),
                    query_param(
                        'groupBy', 'user (default) or jobType.', {'enum': ['user', 'jobType']}
                    ),
                ],
                'responses': dict(
                    {'200': json_response('Totals, costliest first.', ref('UsageTotals'))},
                    **error_responses(400, 401, 403, 503),
                ),
            }
        },
    }
