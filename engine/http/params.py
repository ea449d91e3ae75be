"""The admin job list (contracts §7.1 ``GET /admin-api/ai/jobs``): filters, bounded pages and an
opaque cursor.

The list is newest first by (created_at, id), and the cursor is the last item's (created_at, id):
keyset paging, so a deep page costs what the first does. Every index a filter can use is
(column, created_at), and InnoDB appends the primary key (id) to each secondary index, so one
equality filter plus the created-at range plus the cursor is one index range read in the list's
own order, LIMIT rows long, with no sort — whatever the table's size (ai_job_created_at when there
is no equality filter). On MySQL/MariaDB the read names those indexes (FORCE INDEX, the optimizer
still picks among them): left alone, MariaDB 10.11 reads a deep page's index by its equality
prefix only ("ref") and filters the created-at bound row by row, which with 1 000 000 jobs took
seconds. A job type and a queue together have an index of their own (job type, queue,
created_at), since their rows rarely meet (a job type on a queue it never uses would walk one
filter's index to its end: 3.3 s with 1 000 000 jobs); other pairs of equality filters walk the
more selective filter's index until a page is full. Several lifecycle statuses are one such read per
status, merged here: an IN list over an index cannot come out in created-at order, and sorting
every matching row would grow with the table. Cursors of the first version (``v1``: the last id
only) still work: the id's created_at is read back once."""

import base64
import binascii
import datetime
import heapq
import re
from dataclasses import dataclass
from typing import Optional

import peewee

from ..core.errors import InvalidRequestError
from ..core.models import AiJob, database
from ..core.registry import QUEUE_NAMES
from ..core.states import LEGACY_STATUS_TO_LIFECYCLE, Status

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
PARAMETERS = (
    'jobType',
    'lifecycleStatus',
    'queueName',
    'userId',
    'createdFrom',
    'createdTo',
    'limit',
    'cursor',
)
_JOB_ID = re.compile(r'^[0-9a-f-]{36}$')
EPOCH = datetime.datetime(1970, 1, 1)
CURSOR_PATTERN = r'^[0-9]{1,20}\.[0-9a-f-]{36}$'
_RFC3339 = re.compile(
    r'^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$'
)
# The (column, created_at) index of each equality filter (schema.sql, models.AiJob.Meta.indexes).
_SORTED_INDEXES = (
    ('user_id', 'ai_job_user_id_created_at'),
    ('statuses', 'ai_job_lifecycle_status_created_at'),
    ('job_type', 'ai_job_job_type_created_at'),
    ('queue_name', 'ai_job_queue_name_created_at'),
)
_CREATED_AT_INDEX = 'ai_job_created_at'
_TYPE_AND_QUEUE_INDEX = 'ai_job_job_type_queue_name_created_at'


@dataclass(frozen=True)
class JobQuery:
    job_type: Optional[str] = None
    statuses: tuple = ()
    queue_name: Optional[str] = None
    user_id: Optional[str] = None
    created_from: Optional[datetime.datetime] = None  # inclusive, naive UTC
    created_to: Optional[datetime.datetime] = None  # exclusive, naive UTC
    limit: int = DEFAULT_PAGE_SIZE
    after: Optional[tuple] = None  # from the cursor: (created_at or None for a v1 cursor, id)


def parse_query(params, strict=False):
    """A JobQuery from query-string parameters (``{name: value}``); 400 naming the bad one.
    ``strict`` (the API) takes RFC 3339 times only; the dashboard's form sends datetime-local."""
    times = parse_rfc3339 if strict else parse_time
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise InvalidRequestError(
            'unknown query parameter %s (allowed: %s)' % (unknown[0], ', '.join(PARAMETERS)),
            field=unknown[0],
        )
    queue_name = params.get('queueName') or None
    if queue_name is not None and queue_name not in QUEUE_NAMES:
        raise InvalidRequestError(
            'queueName must be one of %s' % ', '.join(QUEUE_NAMES), field='queueName'
        )
    return JobQuery(
        job_type=params.get('jobType') or None,
        statuses=_statuses(params.get('lifecycleStatus')),
        queue_name=queue_name,
        user_id=params.get('userId') or None,
        created_from=times(params.get('createdFrom'), 'createdFrom'),
        created_to=times(params.get('createdTo'), 'createdTo'),
        limit=_limit(params.get('limit')),
        after=decode_cursor(params.get('cursor')),
    )


def list_jobs(query):
    """(jobs, next_cursor): one page, newest first; next_cursor is None on the last page."""
    after = query.after
    if after is not None and after[0] is None:  # a v1 cursor: its job's created_at
        row = AiJob.select(AiJob.created_at).where(AiJob.id == after[1]).first()
        if row is None:
            raise InvalidRequestError('cursor is not one this API returned', field='cursor')
        after = (row.created_at, after[1])
    conditions = list(_conditions(query, after))
    indexes = _indexes(query)
    if len(query.statuses) <= 1:
        keys = _page_keys(conditions + _status_is(query.statuses), indexes, query.limit + 1)
    else:  # one ordered read per status, merged
        pages = [
            _page_keys(conditions + _status_is((s,)), indexes, query.limit + 1)
            for s in query.statuses
        ]
        merged = heapq.merge(*pages, reverse=True)
        keys = [key for key, _ in zip(merged, range(query.limit + 1), strict=False)]
    jobs = _rows([job_id for _, job_id in keys])
    if len(jobs) <= query.limit:
        return jobs, None
    jobs = jobs[: query.limit]
    return jobs, cursor_for(jobs[-1])


def _page_keys(conditions, indexes, limit):
    """[(created_at, id)] of one page, newest first. Only the sort columns: with one equality
    filter the index alone answers (no row is read for the entries a cursor skips)."""
    select = AiJob.select(AiJob.created_at, AiJob.id)
    if not isinstance(database.obj, peewee.SqliteDatabase):
        hint = peewee.SQL('FORCE INDEX (%s)' % ', '.join('`%s`' % name for name in indexes))
        select = select.from_(peewee.NodeList((AiJob, hint)))
    for condition in conditions:
        select = select.where(condition)
    select = select.order_by(AiJob.created_at.desc(), AiJob.id.desc()).limit(limit)
    return [tuple(row) for row in select.tuples()]


def _rows(job_ids):
    """The jobs of ``job_ids`` in that order, by primary key."""
    if not job_ids:
        return []
    found = {job.id: job for job in AiJob.select().where(AiJob.id.in_(job_ids))}
    return [found[job_id] for job_id in job_ids if job_id in found]


def _indexes(query):
    """The indexes that read ``query``'s rows in the list's order: one per equality filter."""
    names = [name for field, name in _SORTED_INDEXES if getattr(query, field)]
    if query.job_type and query.queue_name:
        # a job type on a queue it never uses would walk either index to its end
        names.append(_TYPE_AND_QUEUE_INDEX)
    return names + [_CREATED_AT_INDEX]


def _status_is(statuses):
    return [AiJob.lifecycle_status == statuses[0]] if statuses else []


def _conditions(query, after):
    if query.job_type:
        yield AiJob.job_type == query.job_type
    if query.queue_name:
        yield AiJob.queue_name == query.queue_name
    if query.user_id:
        yield AiJob.user_id == query.user_id
    if query.created_from:
        yield AiJob.created_at >= query.created_from
    if query.created_to:
        yield AiJob.created_at < query.created_to
    if after is not None:
        created_at, job_id = after
        # the bound alone is an index range; the OR only settles ties of one created_at
        yield AiJob.created_at <= created_at
        yield (AiJob.created_at < created_at) | (AiJob.id < job_id)


def _statuses(raw):
    """Comma-separated lifecycle statuses, nothing else between the commas (STATUS_LIST, as the
    document's pattern says); legacy names (contracts §1.5) are mapped."""
    if raw is None:
        return ()
    statuses = []
    for name in raw.split(','):
        if name in Status._value2member_map_:
            statuses.append(name)
        elif name in LEGACY_STATUS_TO_LIFECYCLE:
            statuses.append(LEGACY_STATUS_TO_LIFECYCLE[name])
        else:
            raise InvalidRequestError(
                'lifecycleStatus %r is not one of %s (legacy names %s are accepted too)'
                % (name, ', '.join(s.value for s in Status), ', '.join(LEGACY_STATUS_TO_LIFECYCLE)),
                field='lifecycleStatus',
            )
    return tuple(dict.fromkeys(statuses))


def parse_time(raw, name):
    """An ISO-8601 time (the dashboard's datetime-local fields too) as naive UTC; None when
    empty. A time outside what UTC can hold (0001-01-01T00:00:00+14:00) is the first or last
    representable instant."""
    if not raw:
        return None
    message = '%s must be an ISO-8601 time such as 2026-06-20T00:00:00Z' % name
    try:
        value = datetime.datetime.fromisoformat(raw.strip().upper().replace('Z', '+00:00'))
    except ValueError:
        raise InvalidRequestError(message, field=name) from None
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    except OverflowError:
        return datetime.datetime.min if value.year == 1 else datetime.datetime.max


def parse_rfc3339(raw, name):
    """The API's times: RFC 3339 date-times only (the document's ``format: date-time``: a full
    time with an offset), None when absent."""
    if raw is None:
        return None
    if not _RFC3339.match(raw):
        raise InvalidRequestError(
            '%s must be an RFC 3339 time such as 2026-06-20T00:00:00Z' % name, field=name
        )
    return parse_time(raw, name)


def _limit(raw):
    if raw is None:
        return DEFAULT_PAGE_SIZE
    limit = whole_number(raw, 1, MAX_PAGE_SIZE)
    if limit is None:
        raise InvalidRequestError(
            'limit must be a whole number 1..%d' % MAX_PAGE_SIZE, field='limit'
        )
    return limit


def whole_number(raw, low, high):
    """``raw`` (query or form text) as an int when it is ASCII digits within ``low..high``, else
    None: not '', '-1', '²' or '①'. A long run of digits is judged by its length and never
    converted: int() of thousands of digits is slow, and past Python's own limit an error."""
    if not (raw.isascii() and raw.isdigit()):
        return None
    digits = raw.lstrip('0') or '0'
    if len(digits) > len(str(high)):
        return None
    value = int(digits)
    return value if low <= value <= high else None


def cursor_for(job):
    """The cursor of the page after ``job`` (a row with created_at and id)."""
    return encode_cursor(job.created_at, job.id)


def encode_cursor(created_at, job_id):
    """``MICROS.JOB_ID`` (CURSOR_PATTERN): the created-at in microseconds since 1970 (UTC), and
    the id. A documented form, so that any value of that form is a cursor the server takes."""
    micros = (created_at - EPOCH) // datetime.timedelta(microseconds=1)
    return '%d.%s' % (micros, job_id)


def decode_cursor(raw):
    """(created_at, job id) from a cursor; created_at is None for a v1 cursor (the id only).
    Cursors handed out before ``MICROS.JOB_ID`` (base64 ``v1:``/``v2:``) still work."""
    if raw is None:
        return None
    micros, dot, job_id = raw.partition('.')
    if dot and micros.isascii() and micros.isdigit() and _JOB_ID.match(job_id):
        try:
            return EPOCH + datetime.timedelta(microseconds=int(micros)), job_id
        except OverflowError:
            return datetime.datetime.max, job_id  # past every job: an empty page
    try:
        text = base64.urlsafe_b64decode(raw + '=' * (-len(raw) % 4)).decode('ascii')
    except (binascii.Error, ValueError):
        text = ''
    version, _, rest = text.partition(':')
    created_at, job_id = None, rest
    if version == 'v2':
        stamp, _, job_id = rest.partition('|')
        try:
            created_at = datetime.datetime.fromisoformat(stamp)
        except ValueError:
            version = None
        if created_at is not None and created_at.tzinfo is not None:
            version = None
    if version not in ('v1', 'v2') or not _JOB_ID.match(job_id):
        raise InvalidRequestError('cursor is not one this API returned', field='cursor')
    return created_at, job_id
