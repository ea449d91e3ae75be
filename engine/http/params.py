"""The admin job list (contracts §7.1 ``GET /admin-api/ai/jobs``): filters, bounded pages and an
opaque cursor. Job ids are time-ordered (store.new_id), so the list is newest first by id and the
cursor is simply the last id seen — keyset paging that stays fast however deep the client pages."""

import base64
import binascii
import datetime
import re
from dataclasses import dataclass
from typing import Optional

from ..core.errors import InvalidRequestError
from ..core.lifecycle import LEGACY_STATUS_TO_LIFECYCLE, Status
from ..core.models import AiJob
from ..core.registry import QUEUE_NAMES

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


@dataclass(frozen=True)
class JobQuery:
    job_type: Optional[str] = None
    statuses: tuple = ()
    queue_name: Optional[str] = None
    user_id: Optional[str] = None
    created_from: Optional[datetime.datetime] = None  # inclusive, naive UTC
    created_to: Optional[datetime.datetime] = None  # exclusive, naive UTC
    limit: int = DEFAULT_PAGE_SIZE
    after_id: Optional[str] = None  # from the cursor


def parse_query(params):
    """A JobQuery from query-string parameters (``{name: value}``); 400 naming the bad one."""
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
        created_from=parse_time(params.get('createdFrom'), 'createdFrom'),
        created_to=parse_time(params.get('createdTo'), 'createdTo'),
        limit=_limit(params.get('limit')),
        after_id=decode_cursor(params.get('cursor')),
    )


def list_jobs(query):
    """(jobs, next_cursor): one page, newest first; next_cursor is None on the last page."""
    select = AiJob.select()
    for condition in _conditions(query):
        select = select.where(condition)
    jobs = list(select.order_by(AiJob.id.desc()).limit(query.limit + 1))
    if len(jobs) <= query.limit:
        return jobs, None
    jobs = jobs[: query.limit]
    return jobs, encode_cursor(jobs[-1].id)


def _conditions(query):
    if query.job_type:
        yield AiJob.job_type == query.job_type
    if query.statuses:
        yield AiJob.lifecycle_status.in_(list(query.statuses))
    if query.queue_name:
        yield AiJob.queue_name == query.queue_name
    if query.user_id:
        yield AiJob.user_id == query.user_id
    if query.created_from:
        yield AiJob.created_at >= query.created_from
    if query.created_to:
        yield AiJob.created_at < query.created_to
    if query.after_id:
        yield AiJob.id < query.after_id


def _statuses(raw):
    """Comma-separated lifecycle statuses; legacy names (contracts §1.5) are mapped."""
    if not raw:
        return ()
    statuses = []
    for name in (part.strip() for part in raw.split(',') if part.strip()):
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
    if not raw:
        return None
    try:
        value = datetime.datetime.fromisoformat(raw.strip().replace('Z', '+00:00'))
    except ValueError:
        raise InvalidRequestError(
            '%s must be an ISO-8601 time such as 2026-06-20T00:00:00Z' % name, field=name
        ) from None
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return value


def _limit(raw):
    if raw is None or raw == '':
        return DEFAULT_PAGE_SIZE
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE_SIZE:
        raise InvalidRequestError(
            'limit must be a whole number 1..%d' % MAX_PAGE_SIZE, field='limit'
        )
    return int(raw)


def encode_cursor(job_id):
    return base64.urlsafe_b64encode(('v1:' + job_id).encode('ascii')).decode('ascii').rstrip('=')


def decode_cursor(raw):
    if not raw:
        return None
    try:
        text = base64.urlsafe_b64decode(raw + '=' * (-len(raw) % 4)).decode('ascii')
    except (binascii.Error, ValueError):
        text = ''
    version, _, job_id = text.partition(':')
    if version != 'v1' or not _JOB_ID.match(job_id):
        raise InvalidRequestError('cursor is not one this API returned', field='cursor')
    return job_id
