"""The provider batch resource: provider batches as operators see them (issue 22 item 5). The
admin list ``GET /admin-api/ai/batches`` with its checks, keyset pages and part of the OpenAPI
document; one batch with its jobs for the dashboard; the gauges a scrape reads. Reads only: the
batcher (engine/features/batches/) writes these tables.

Every read is bounded: a page of batches by (created_at, id), a batch's items by their batch id,
the waiting items and the open batches through their state indexes. Only the cost gauge reads
every batch row, and there is one row per batch of up to ``max_jobs`` jobs."""

import datetime
import re
from decimal import Decimal

from peewee import fn
from prometheus_client.core import GaugeMetricFamily

from ...core.errors import BatchNotFoundError, InvalidRequestError
from ...core.models import AiJob
from ...http import parsing
from ...http.openapi import (
    MONEY,
    NULLABLE_TIME,
    TIME,
    error_responses,
    json_response,
    page_params,
    query_param,
    ref,
)
from ...http.params import DEFAULT_PAGE_SIZE, EPOCH, MAX_PAGE_SIZE, encode_cursor, whole_number
from ...http.replies import reply
from ...http.views import iso
from . import batcher, items
from .models import AiProviderBatch, AiProviderBatchItem

BATCH_STATES = (
    batcher.BUILDING,
    batcher.UPLOADED,
    batcher.SUBMITTED,
    batcher.CANCELLING,
    batcher.ENDED,
)
OPEN_STATES = BATCH_STATES[:-1]
IN_BATCH_ITEM_STATES = (items.WAITING, items.BATCHED)  # the jobs a batch holds or is about to
LIST_PARAMETERS = ('state', 'limit', 'cursor')
MAX_ITEMS_SHOWN = 1000  # a batch page lists at most this many of its jobs
CURSOR_PATTERN = r'^[0-9]{1,20}\.[0-9A-Za-z_-]{1,36}$'
_CURSOR = re.compile(CURSOR_PATTERN)
COST_PLACES = Decimal('0.000001')  # DECIMAL(14, 6)


_NULLABLE_TEXT = {'type': ['string', 'null']}
_COUNT = {'type': 'integer', 'minimum': 0}


class BatchRoutes:
    """GET /admin-api/ai/batches."""

    def __init__(self, runtime, access):
        self.access = access

    def routes(self):
        return (('GET', '/admin-api/ai/batches', self.admin_list_batches, True),)

    def paths(self):
        return _paths()

    def schemas(self):
        view = {
            'batchId': {'type': 'string'},
            'provider': {'type': 'string', 'description': 'The route entry the batch went to.'},
            'model': {'type': 'string'},
            'state': {
                'enum': list(BATCH_STATES),
                'description': 'building (jobs chosen) -> uploaded (input file stored) -> '
                'submitted (the provider has the batch) -> ended (every job has its line); '
                'cancelling: every job of it was cancelled and the provider is told.',
            },
            'providerStatus': dict(
                _NULLABLE_TEXT,
                description='What the provider last said (validating, in_progress, …).',
            ),
            'providerBatchId': _NULLABLE_TEXT,
            'inputFileId': _NULLABLE_TEXT,
            'outputFileId': _NULLABLE_TEXT,
            'errorFileId': _NULLABLE_TEXT,
            'jobCount': _COUNT,
            'succeededCount': dict(_COUNT, description='Lines answered.'),
            'failedCount': dict(
                _COUNT, description='Lines that failed, expired or were cancelled.'
            ),
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
                    'items': {'type': 'array', 'items': ref('ProviderBatch')},
                    'nextCursor': {'type': ['string', 'null']},
                    'limit': {'type': 'integer', 'minimum': 1, 'maximum': MAX_PAGE_SIZE},
                },
            },
        }

    def admin_list_batches(self):
        self.access.admin()
        state, limit, after = parse_list_query(parsing.query())
        batches, next_cursor = list_batches(state, limit, after)
        return reply(
            {'items': [batch_view(b) for b in batches], 'nextCursor': next_cursor, 'limit': limit}
        )


# ---------------------------------------------------------------- the list
def parse_list_query(params):
    """(state or None, limit, after or None) from query parameters; 400 naming the bad one.
    An empty value is as wrong as an unknown one."""
    unknown = sorted(set(params) - set(LIST_PARAMETERS))
    if unknown:
        raise InvalidRequestError(
            'unknown query parameter %s (allowed: %s)' % (unknown[0], ', '.join(LIST_PARAMETERS)),
            field=unknown[0],
        )
    state = params.get('state')
    if state is not None and state not in BATCH_STATES:
        raise InvalidRequestError(
            'state must be one of %s' % ', '.join(BATCH_STATES), field='state'
        )
    limit = DEFAULT_PAGE_SIZE
    if params.get('limit') is not None:
        limit = whole_number(params['limit'], 1, MAX_PAGE_SIZE)
        if limit is None:
            raise InvalidRequestError(
                'limit must be a whole number 1..%d' % MAX_PAGE_SIZE, field='limit'
            )
    return state, limit, _decode_cursor(params.get('cursor'))


def list_batches(state, limit, after):
    """(batches, next_cursor): one page, newest first; next_cursor None on the last page."""
    select = AiProviderBatch.select()
    if state is not None:
        select = select.where(AiProviderBatch.state == state)
    if after is not None:
        created_at, batch_id = after
        select = select.where(
            AiProviderBatch.created_at <= created_at,
            (AiProviderBatch.created_at < created_at) | (AiProviderBatch.id < batch_id),
        )
    select = select.order_by(AiProviderBatch.created_at.desc(), AiProviderBatch.id.desc())
    rows = list(select.limit(limit + 1))
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], encode_cursor(last.created_at, last.id)  # the job list's form


def _decode_cursor(raw):
    if raw is None:
        return None
    if not _CURSOR.match(raw):
        raise InvalidRequestError('cursor is not one this API returned', field='cursor')
    micros, _, batch_id = raw.partition('.')
    try:
        return EPOCH + datetime.timedelta(microseconds=int(micros)), batch_id
    except OverflowError:
        return datetime.datetime.max, batch_id  # past every batch: an empty page


def batch_view(batch):
    """A batch as the admin API shows it."""
    return {
        'batchId': batch.id,
        'provider': batch.provider,
        'model': batch.model,
        'state': batch.state,
        'providerStatus': batch.provider_status or None,
        'providerBatchId': batch.provider_batch_id,
        'inputFileId': batch.input_file_id,
        'outputFileId': batch.output_file_id,
        'errorFileId': batch.error_file_id,
        'jobCount': batch.job_count,
        'succeededCount': batch.succeeded_count,
        'failedCount': batch.failed_count,
        'cost': str(money(batch.cost)),
        'pollCount': batch.poll_count,
        'nextPollAt': iso(batch.next_poll_at),
        'createdAt': iso(batch.created_at),
        'submittedAt': iso(batch.submitted_at),
        'endedAt': iso(batch.ended_at),
    }


def money(value):
    return Decimal(str(value or 0)).quantize(COST_PLACES)


# ---------------------------------------------------------------- one batch and the waiting jobs
def find_batch(batch_id):
    batch = AiProviderBatch.get_or_none(AiProviderBatch.id == batch_id)
    if batch is None:
        raise BatchNotFoundError()
    return batch


def batch_jobs(batch_id):
    """[(item, the job's lifecycle status or None)] of a batch, at most MAX_ITEMS_SHOWN."""
    rows = list(
        AiProviderBatchItem.select()
        .where(AiProviderBatchItem.batch_id == batch_id)
        .order_by(AiProviderBatchItem.id)
        .limit(MAX_ITEMS_SHOWN)
    )
    job_ids = [row.job_id for row in rows]
    statuses = dict(
        AiJob.select(AiJob.id, AiJob.lifecycle_status).where(AiJob.id.in_(job_ids)).tuples()
    )
    return [(row, statuses.get(row.job_id)) for row in rows]


def waiting_groups():
    """[(group 'provider/model', jobs waiting for a batch, the oldest one's created_at)]."""
    return list(
        AiProviderBatchItem.select(
            AiProviderBatchItem.group_key,
            fn.COUNT(AiProviderBatchItem.id),
            fn.MIN(AiProviderBatchItem.created_at),
        )
        .where(AiProviderBatchItem.state == items.WAITING)
        .group_by(AiProviderBatchItem.group_key)
        .order_by(AiProviderBatchItem.group_key)
        .tuples()
    )


# ---------------------------------------------------------------- the scrape's gauges
def batch_gauges():
    """Open batches by state, jobs waiting for or in a batch, and the batches' cost."""
    open_batches = _state_gauge(
        'aijob_provider_batches_open',
        'Provider batches not yet ended, by state.',
        AiProviderBatch,
        OPEN_STATES,
    )
    jobs = _state_gauge(
        'aijob_provider_batch_jobs',
        'Jobs waiting for a provider batch (waiting) or in a submitted one (batched).',
        AiProviderBatchItem,
        IN_BATCH_ITEM_STATES,
    )
    cost = GaugeMetricFamily(
        'aijob_provider_batch_cost',
        'Cost of the provider batches kept in the store, at the batch price.',
    )
    total = AiProviderBatch.select(fn.SUM(AiProviderBatch.cost)).scalar()
    cost.add_metric([], float(money(total)))
    return [open_batches, jobs, cost]


def _state_gauge(name, documentation, model, states):
    """A gauge of ``model``'s rows in each of ``states`` (0 for a state with none)."""
    gauge = GaugeMetricFamily(name, documentation, labels=('state',))
    counts = _counts(model, states)
    for state in states:
        gauge.add_metric([state], counts.get(state, 0))
    return gauge


def _counts(model, states):
    """{state: rows} over the state index, for ``states`` only."""
    return dict(
        model.select(model.state, fn.COUNT(model.id))
        .where(model.state.in_(states))
        .group_by(model.state)
        .tuples()
    )


def _paths():
    return {
        '/admin-api/ai/batches': {
            'get': {
                'summary': 'Provider batches, newest first (SUPER_ADMIN).',
                'parameters': [
                    query_param(
                        'state', 'Only batches in this state.', {'enum': list(BATCH_STATES)}
                    ),
                    *page_params(
                        "MICROS.BATCH_ID, the last batch's createdAt in microseconds since 1970 "
                        '(UTC) and its id.',
                        CURSOR_PATTERN,
                    ),
                ],
                'responses': dict(
                    {'200': json_response('One page.', ref('ProviderBatchList'))},
                    **error_responses(400, 401, 403, 503),
                ),
            }
        }
    }
