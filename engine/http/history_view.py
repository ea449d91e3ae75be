"""``GET /api/ai/jobs/{id}/events``: a job's transition history (architecture decision 14) as
JSON, a page at a time after an event id. The owner sees each row's public view (no worker or
dispatcher ids, no internal messages), SUPER_ADMIN everything."""

from ..core.errors import InvalidRequestError
from ..core.history import JobHistory
from .params import whole_number

DEFAULT_LIMIT = 200
MAX_LIMIT = 1000
MAX_AFTER = 2**63 - 1  # event ids are BIGINT
PARAMETERS = ('after', 'limit')


def parse_query(params):
    """(after, limit) from the query string; 400 INVALID_REQUEST for anything else."""
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise InvalidRequestError('unknown query parameter %s' % unknown[0], field=unknown[0])
    after = _whole(params.get('after'), 'after', 0, MAX_AFTER)
    limit = _whole(params.get('limit'), 'limit', 1, MAX_LIMIT)
    return after, DEFAULT_LIMIT if limit is None else limit


def _whole(raw, name, low, high):
    if raw is None or raw == '':
        return None
    value = whole_number(raw, low, high)
    if value is None:
        raise InvalidRequestError(
            '%s must be a whole number %d..%d' % (name, low, high), field=name
        )
    return value


def job_events(store, job, after, limit, full):
    """The response body: up to ``limit`` events of ``job`` after event id ``after``, oldest
    first; ``nextAfter`` is the last one's id when more may follow (else null)."""
    events = JobHistory(store).list(job.id, after_id=after, limit=limit + 1)
    more = len(events) > limit
    events = events[:limit]
    return {
        'jobId': job.id,
        'lifecycleStatus': job.lifecycle_status,
        'events': [event.admin() if full else event.public() for event in events],
        'nextAfter': events[-1].id if more else None,
    }
