"""The busiest users as operators see them (issue 33, item 6): for the users with the most jobs
waiting, their jobs waiting and running, the age of their oldest waiting job, and the wait from
create to running (p50, p95) of their jobs that started recently. The metrics' scrape and the
dashboard's overview both read it, each when it is asked for.

Why the database, at read time: it is the truth, and it knows user ids, where the queues hold
only opaque user keys (fairness.py); and a read at scrape time keeps no state in any process
(a histogram per user fed by the start signal would grow a series for every user ever seen).
Bounded: the BUSIEST_USERS first only (so a metric's label values are at most that many), the
waits of jobs started in the last WAIT_WINDOW, and of those at most the MAX_WAITS latest per user.

Cheap as history grows: every read is a range of one index, (lifecycle_status, user_id,
started_at, created_at), that answers it alone. The jobs waiting are the 'queued' range, grouped
by user in the index's order; the jobs running, one 'running' range per user; a user's waits,
one range of started_at per status (every status: a job keeps its started_at), each as long as
that user's starts in the window. Nothing reads the finished history beyond the window.
"""

import datetime
import math
from dataclasses import dataclass
from typing import Optional

import peewee

from .models import AiJob, database
from .states import QUEUED, RUNNING, Status

BUSIEST_USERS = 10
WAIT_WINDOW = datetime.timedelta(minutes=5)
MAX_WAITS = 1000  # per user: the latest starts in the window
QUANTILES = (0.5, 0.95)
INDEX = 'ai_job_lifecycle_status_user_id_started_at_created_at'
STATUSES = tuple(status.value for status in Status)


@dataclass(frozen=True)
class UserLoad:
    """One busy user: counts now, and the waits of the jobs it started in the window."""

    user_id: str
    waiting: int  # queued jobs
    running: int
    oldest_waiting_s: float  # age of the oldest queued job; 0 when none waits
    waits: int  # jobs started in the window that the quantiles are over (at most MAX_WAITS)
    wait_p50_s: Optional[float]  # None when no job started in the window
    wait_p95_s: Optional[float]


def busiest_users(store, limit=BUSIEST_USERS, window=WAIT_WINDOW):
    """The ``limit`` users with the most jobs waiting (most first; ties by user id), then, when
    fewer users wait, those with the most running (who wait for nothing). The caller holds a
    store connection."""
    now = store.clock()
    waiting = _waiting(limit)
    running = _running(list(waiting))
    if len(waiting) < limit:
        for user_id, count in _most_running(limit + len(waiting)):
            if user_id not in waiting and len(running) < limit:
                running[user_id] = count
    chosen = sorted(
        set(waiting) | set(running),
        key=lambda user: (-waiting.get(user, (0, None))[0], -running.get(user, 0), user),
    )[:limit]
    since = now - window
    loads = []
    for user_id in chosen:
        count, oldest = waiting.get(user_id, (0, None))
        waits = sorted(_waits(user_id, since))
        p50, p95 = (quantile(waits, q) for q in QUANTILES)
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        loads.append(UserLoad(user_id, count, running.get(user_id, 0), age, len(waits), p50, p95))
    return loads


def quantile(ordered, q):
    """The nearest-rank quantile of an ascending list: the least value that ``q`` of the
    values are at or below (p50 of 1..20 is 10, p95 is 19); None for an empty list."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def _waiting(limit):
    """{user_id: (queued jobs, oldest created_at)} of the ``limit`` users with the most."""
    count = peewee.fn.COUNT(AiJob.id)
    query = (
        _indexed(AiJob.user_id, count, peewee.fn.MIN(AiJob.created_at))
        .where(AiJob.lifecycle_status == QUEUED)
        .group_by(AiJob.user_id)
        .order_by(count.desc(), AiJob.user_id)
        .limit(limit)
    )
    return {user: (int(n), _datetime(oldest)) for user, n, oldest in query.tuples()}


def _running(user_ids):
    """{user_id: running jobs} of ``user_ids`` (those with none left out)."""
    if not user_ids:
        return {}
    query = (
        _indexed(AiJob.user_id, peewee.fn.COUNT(AiJob.id))
        .where((AiJob.lifecycle_status == RUNNING) & AiJob.user_id.in_(user_ids))
        .group_by(AiJob.user_id)
    )
    return {user: int(n) for user, n in query.tuples()}


def _most_running(limit):
    """[(user_id, running jobs)] of the ``limit`` users with the most, most first."""
    count = peewee.fn.COUNT(AiJob.id)
    query = (
        _indexed(AiJob.user_id, count)
        .where(AiJob.lifecycle_status == RUNNING)
        .group_by(AiJob.user_id)
        .order_by(count.desc(), AiJob.user_id)
        .limit(limit)
    )
    return [(user, int(n)) for user, n in query.tuples()]


def _waits(user_id, since):
    """Seconds from create to first lock of the user's latest MAX_WAITS jobs started since
    ``since`` (started_at is written once, at the first lock: lifecycle_sql.py)."""
    query = (
        _indexed(AiJob.started_at, AiJob.created_at)
        .where(
            AiJob.lifecycle_status.in_(STATUSES)  # the index's first column: one range each
            & (AiJob.user_id == user_id)
            & (AiJob.started_at >= since)
        )
        .order_by(AiJob.started_at.desc())
        .limit(MAX_WAITS)
    )
    return [
        max(0.0, (_datetime(started) - _datetime(created)).total_seconds())
        for started, created in query.tuples()
    ]


def _indexed(*columns):
    """A select of ``columns`` that reads INDEX on MySQL/MariaDB, whose optimizer would
    otherwise take an index led by user_id ((user_id, created_at)) and read a user's whole
    history."""
    select = AiJob.select(*columns)
    if not isinstance(database.obj, peewee.SqliteDatabase):
        hint = peewee.SQL('FORCE INDEX (`%s`)' % INDEX)
        select = select.from_(peewee.NodeList((AiJob, hint)))
    return select


def _datetime(value):
    if isinstance(value, str):  # SQLite hands back an aggregate's text
        return datetime.datetime.fromisoformat(value)
    return value
