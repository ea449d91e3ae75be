"""A crafted set of users' jobs with known counts and waits, for the busiest users' reads
(engine/core/busiest_users.py), their metrics and the dashboard's panel. Jobs are created and
locked through the real service and lifecycle; only their created_at and started_at are then
set, so each wait is exact."""

import datetime

from engine.core.models import AiJob
from tests.support.api import run_to_running
from tests.support.helpers import create_job

SECOND = datetime.timedelta(seconds=1)

# user: (queued, oldest queued's age in s, started in the window as [(wait s, finished?)])
# heavy: 20 waits of 1..20 s, one still running: p50 10 s, p95 19 s (nearest rank).
# light: 2 running, waits 0.5 s and 1.5 s, nothing queued: p50 0.5 s, p95 1.5 s.
# idle: 5 queued, nothing started: no quantile.
EXPECTED = {
    'user-idle': {'waiting': 5, 'running': 0, 'waits': 0, 'p50': None, 'p95': None},
    'user-heavy': {'waiting': 3, 'running': 1, 'waits': 20, 'p50': 10.0, 'p95': 19.0},
    'user-light': {'waiting': 0, 'running': 2, 'waits': 2, 'p50': 0.5, 'p95': 1.5},
}
ORDER = ['user-idle', 'user-heavy', 'user-light']  # most waiting first, then most running
OLDEST_WAITING_S = {'user-idle': 50.0, 'user-heavy': 30.0}


def set_times(job_id, created_at, started_at=None):
    fields = {AiJob.created_at: created_at}
    if started_at is not None:
        fields[AiJob.started_at] = started_at
    AiJob.update(fields).where(AiJob.id == job_id).execute()


def started(rt, user_id, wait_s, started_at, finish=True):
    """A job of ``user_id`` locked at ``started_at`` after ``wait_s`` seconds queued."""
    job = create_job(rt, user_id=user_id, target_id='n-%s' % wait_s)
    fence = run_to_running(rt, job.id)
    set_times(job.id, started_at - wait_s * SECOND, started_at)
    if finish:
        rt.lifecycle.mark_succeeded(job.id, fence=fence)
    return job


def queued(rt, user_id, age_s, now):
    job = create_job(rt, user_id=user_id)
    set_times(job.id, now - age_s * SECOND)
    return job


def craft(rt):
    """The jobs of EXPECTED (and jobs the reads must leave out); returns the clock's now."""
    now = rt.store.clock()
    in_window = now - 60 * SECOND
    for wait_s in range(1, 21):
        started(rt, 'user-heavy', wait_s, in_window, finish=wait_s != 7)
    # Started before the window: not among the waits.
    started(rt, 'user-heavy', 500, now - 10 * 60 * SECOND)
    for age_s in (30, 20, 10):
        queued(rt, 'user-heavy', age_s, now)
    for age_s in (50, 40, 30, 20, 10):
        queued(rt, 'user-idle', age_s, now)
    started(rt, 'user-light', 0.5, in_window, finish=False)
    started(rt, 'user-light', 1.5, in_window, finish=False)
    # Finished in the window, nothing waiting or running: not busy.
    started(rt, 'user-done', 3, in_window)
    return now
