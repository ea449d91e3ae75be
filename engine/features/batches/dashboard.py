"""The provider batches' pages on the operators' dashboard (engine/features/dashboard/, when
installed): the list with the jobs waiting for a batch, and one batch with its jobs. Plain values
for the templates in templates/; the dashboard serves them to a signed-in operator, with the
helpers every template has (``when``, ``duration``, ``job_url``, ``urlencode``, ``prefix``)."""

import datetime
import os
import re
from urllib.parse import quote

from ...core.errors import BatchNotFoundError, InvalidRequestError
from ...core.extension import DashboardPage
from . import routes as batches

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'templates')
_BATCH_ID = re.compile(r'^[0-9A-Za-z_-]{1,64}$')
BATCH_FILTERS = ('state', 'cursor')


def batch_list(runtime, params):
    """A page of provider batches under a state filter, and the jobs still waiting for one. A
    bad filter is reported on the page, not raised."""
    chosen = {name: params[name] for name in BATCH_FILTERS if params.get(name)}
    now = runtime.store.clock()
    values = {'filters': chosen, 'error': None, 'batches': [], 'next_cursor': None}
    values['states'], values['now'], values['batch_url'] = batches.BATCH_STATES, now, batch_url
    try:
        state, limit, after = batches.parse_list_query(chosen)
        rows, values['next_cursor'] = batches.list_batches(state, limit, after)
        values['batches'] = [_batch_row(batch) for batch in rows]
    except InvalidRequestError as exc:
        values['error'] = exc.public_message
    values['page_query'] = {k: v for k, v in chosen.items() if k != 'cursor'}
    values['waiting'] = [
        {'group': group, 'jobs': count, 'oldest': _datetime(oldest)}
        for group, count, oldest in batches.waiting_groups()
    ]
    return values


def batch_detail(runtime, params, batch_id):
    if not _BATCH_ID.match(batch_id):
        raise BatchNotFoundError()
    batch = batches.find_batch(batch_id)
    jobs = batches.batch_jobs(batch.id)
    return {
        'batch': _batch_row(batch),
        'now': runtime.store.clock(),
        'jobs': [{'item': item, 'status': status} for item, status in jobs],
        'shown_all': len(jobs) < batches.MAX_ITEMS_SHOWN,
    }


def batch_url(batch_id):
    return '/dashboard/batches/%s' % quote(batch_id, safe='')


def _batch_row(batch):
    return {'batch': batch, 'cost': batches.money(batch.cost)}


def _datetime(value):
    if isinstance(value, str):  # an aggregate over SQLite comes back as text
        return datetime.datetime.fromisoformat(value)
    return value


PAGES = (
    DashboardPage(
        path='/batches',
        title='Batches',
        tab='Batches',
        template=os.path.join(TEMPLATES, 'batches.tpl'),
        read=batch_list,
        summary='Provider batches (state, provider status, counts, age, cost) and the jobs '
        'waiting for one; ``state`` and ``cursor`` filter and page the list.',
    ),
    DashboardPage(
        path='/batches/<batch_id>',
        title='Batch',
        tab='Batches',
        template=os.path.join(TEMPLATES, 'batch.tpl'),
        read=batch_detail,
        summary='One provider batch and its jobs.',
        errors=(404,),
    ),
)
