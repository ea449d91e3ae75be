"""What each dashboard page shows, as plain values for its template: read through the engine's
own APIs (the overview reads, the admin list and its parameters, the history, usage totals).
No HTTP here and no HTML: the templates escape every value they print."""

import datetime
import json
from dataclasses import dataclass

from ...core.busiest_users import WAIT_WINDOW, busiest_users
from ...core.errors import AiJobError, InvalidRequestError, JobNotFoundError
from ...core.history import JobHistory
from ...core.models import AiJob, AiJobSnapshot, AiUsageLog
from ...core.registry import QUEUE_NAMES
from ...core.states import CANCELLED, FAILED, SUCCEEDED, TERMINAL
from ...execution.usage import usage_totals
from ...http import params as admin_jobs
from ...http import views
from .overview import STATES, Overview

CHART_WIDTH, CHART_HEIGHT = 720, 120
LIVE_REFRESH_MS = 3000  # how often a page's live part is fetched again
JOB_REFRESH_MS = 1000  # a running job's page: one job's row, so it can be watched closely
DEFAULT_USAGE_WINDOW = datetime.timedelta(days=7)
JOB_FILTERS = admin_jobs.PARAMETERS


# ---------------------------------------------------------------- formatting for templates
def when(value):
    """A naive UTC datetime as '2026-06-20 12:34:56' (the dashboard says UTC once, in the
    header), or '' when unset."""
    return value.strftime('%Y-%m-%d %H:%M:%S') if value else ''


def duration(start, end):
    """'1.234 s', '2 min 5 s', … between two datetimes, or '' unless both are set."""
    if not (start and end):
        return ''
    seconds = (end - start).total_seconds()
    if seconds < 60:
        return '%.3f s' % seconds
    if seconds < 3600:
        return '%d min %d s' % divmod(int(seconds), 60)
    return '%d h %d min' % divmod(int(seconds) // 60, 60)


def pretty(value):
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def input_value(value):
    """A datetime as the value of an ``<input type=datetime-local>`` (UTC), or ''."""
    return value.strftime('%Y-%m-%dT%H:%M') if value else ''


# ---------------------------------------------------------------- overview
@dataclass(frozen=True)
class Bar:
    """One minute of the chart, in SVG user units (y grows downwards)."""

    x: float
    width: float
    succeeded: tuple  # (y, height)
    failed: tuple
    cancelled: tuple
    title: str


def overview(runtime):
    reads = Overview(runtime.store)
    now = runtime.store.clock()
    counts = reads.state_counts(now)
    minutes = reads.throughput(now)
    queues = [_queue_row(runtime.queue, name, counts) for name in QUEUE_NAMES]
    running = reads.running_by_worker()
    deferred = running.pop(None, [])  # running with no holder: waiting for their wake time
    workers, lost = _workers(runtime.queue, running)
    finished = sum(m.finished for m in minutes)
    failed = sum(m.failed for m in minutes)
    return {
        'now': now,
        'states': STATES,
        'queues': queues,
        'totals': {state: sum(q['counts'][state] for q in queues) for state in STATES},
        'outbox': reads.outbox_counts(),
        'workers': workers,
        'lost': lost,
        'deferred': deferred,
        'chart': chart(minutes),
        'finished_last_hour': finished,
        'failure_rate': '%.1f %%' % (100.0 * failed / finished) if finished else '–',
        'cooldowns': _cooldowns(runtime),
        'busiest': busiest_users(runtime.store),
        'wait_window_min': int(WAIT_WINDOW.total_seconds() // 60),
    }


def seconds(value):
    """'0.250 s', '2 min 5 s', … for a number of seconds, or '–' when there is none."""
    if value is None:
        return '–'
    start = datetime.datetime(2000, 1, 1)
    return duration(start, start + datetime.timedelta(seconds=value))


def _cooldowns(runtime):
    """[(provider/model, seconds left)] of the route entries cooling down now (the gateway)."""
    state = runtime.ai.gateway.cooldown_state()
    return sorted((entry, left) for entry, left in state.items() if left > 0)


def _queue_row(queue, name, counts):
    row = {'name': name, 'counts': {state: counts.get((name, state), 0) for state in STATES}}
    try:
        row['depth'], row['in_flight'] = queue.depth(name), queue.in_flight(name)
    except AiJobError:
        row['depth'] = row['in_flight'] = None  # the template says "unavailable"
    return row


def _workers(queue, running):
    """([{id, ttl_ms, jobs}], [jobs whose lock holder has no live heartbeat])."""
    try:
        alive = queue.consumers()
    except AiJobError:
        alive = {}
    workers = [
        {'id': worker_id, 'ttl_ms': ttl_ms, 'jobs': running.get(worker_id, [])}
        for worker_id, ttl_ms in sorted(alive.items())
    ]
    lost = [job for holder, jobs in running.items() if holder not in alive for job in jobs]
    return workers, lost


def chart(minutes):
    """Stacked bars (succeeded, failed, cancelled) per minute, and the failure rate as a line
    over the minutes where something finished; scaled to CHART_WIDTH × CHART_HEIGHT."""
    peak = max([m.finished for m in minutes] + [1])
    step = CHART_WIDTH / max(1, len(minutes))
    bars, rate = [], []
    for i, minute in enumerate(minutes):
        bottom = CHART_HEIGHT
        parts = []
        for count in (minute.succeeded, minute.failed, minute.cancelled):
            height = CHART_HEIGHT * count / peak
            parts.append((round(bottom - height, 2), round(height, 2)))
            bottom -= height
        title = '%s UTC: %d succeeded, %d failed, %d cancelled' % (
            minute.start.strftime('%H:%M'),
            minute.succeeded,
            minute.failed,
            minute.cancelled,
        )
        bars.append(Bar(round(i * step + 1, 2), round(step - 2, 2), *parts, title))
        if minute.failure_rate is not None:
            y = CHART_HEIGHT * (1 - minute.failure_rate)
            rate.append((round(i * step + step / 2, 2), round(y, 2)))
    return {
        'width': CHART_WIDTH,
        'height': CHART_HEIGHT,
        'peak': peak,
        'bars': bars,
        'rate': rate,  # [(x, y)] of the minutes where something finished
        'rate_points': ' '.join('%s,%s' % point for point in rate),
        'start': minutes[0].start if minutes else None,
    }


# ---------------------------------------------------------------- the job list
def job_list(runtime, params):
    """The admin list (engine/http/params.py) under the dashboard's filter form. Returns the
    page's values; a bad filter is reported on the page, not raised."""
    chosen = {name: params[name] for name in JOB_FILTERS if params.get(name)}
    values = {'filters': chosen, 'error': None, 'jobs': [], 'next_cursor': None}
    values['job_types'] = sorted(d.job_type for d in runtime.registry.get_all())
    values['statuses'], values['queue_names'] = STATES, QUEUE_NAMES
    try:
        query = admin_jobs.parse_query(chosen)
        values['jobs'], values['next_cursor'] = admin_jobs.list_jobs(query)
    except InvalidRequestError as exc:
        values['error'] = exc.public_message
    values['page_query'] = {k: v for k, v in chosen.items() if k != 'cursor'}
    return values


# ---------------------------------------------------------------- one job
def job_detail(runtime, job_id):
    job = AiJob.get_or_none(AiJob.id == job_id)
    if job is None:
        raise JobNotFoundError(job_id)
    snapshot = AiJobSnapshot.get_or_none(AiJobSnapshot.job_id == job.id)
    usage = list(AiUsageLog.select().where(AiUsageLog.job_id == job.id).order_by(AiUsageLog.id))
    return {
        'job': job,
        'terminal': job.lifecycle_status in TERMINAL,
        'can_cancel': job.lifecycle_status not in TERMINAL and job.cancel_requested_at is None,
        'can_retry': job.lifecycle_status in (FAILED, CANCELLED),
        'events': _timeline(JobHistory(runtime.store).list(job.id)),
        'input': pretty(snapshot.content) if snapshot is not None else None,
        'artifacts': views.artifact_contents(job)['artifacts'],
        'usage': usage,
        'usage_total': _usage_total(usage),
        'answered_by': _answered_by(job, usage),
        'retries': list(
            AiJob.select(AiJob.id, AiJob.lifecycle_status, AiJob.created_at)
            .where(AiJob.retry_of_job_id == job.id)
            .order_by(AiJob.created_at)
        ),
        'since_default': input_value(runtime.store.clock() - datetime.timedelta(days=1)),
    }


def _timeline(events):
    """The admin view of each event plus ``after``: the time since the first one."""
    start = events[0].at if events else None
    return [dict(event.admin(), after=duration_since(start, event.at)) for event in events]


def duration_since(start, at):
    seconds = (at - start).total_seconds()
    return '+%.3f s' % seconds if seconds < 60 else '+' + duration(start, at)


def _answered_by(job, usage):
    """'provider/model' whose answer a succeeded job's result is (its call without an error)."""
    if job.lifecycle_status != SUCCEEDED:
        return None
    answered = [row for row in usage if row.error_code is None]
    return '%s/%s' % (answered[-1].provider, answered[-1].model) if answered else None


def _usage_total(rows):
    return {
        'calls': len(rows),
        'prompt_tokens': sum(r.prompt_tokens for r in rows),
        'completion_tokens': sum(r.completion_tokens for r in rows),
        'cost': sum((r.cost for r in rows), start=0),
    }


# ---------------------------------------------------------------- usage
def usage(runtime, params):
    """Totals by user and by job type over [since, until): by default the last 7 days."""
    values = {'error': None, 'by_user': [], 'by_type': []}
    try:
        until = admin_jobs.parse_time(params.get('until'), 'until') or runtime.store.clock()
        since = admin_jobs.parse_time(params.get('since'), 'since') or until - DEFAULT_USAGE_WINDOW
        if since >= until:
            raise InvalidRequestError('since must be before until', field='since')
        values['by_user'] = usage_totals(since, until, 'user')
        values['by_type'] = usage_totals(since, until, 'job_type')
    except InvalidRequestError as exc:
        values['error'] = exc.public_message
        until = runtime.store.clock()
        since = until - DEFAULT_USAGE_WINDOW
    values['since'], values['until'] = since, until
    return values
