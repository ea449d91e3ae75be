"""What an operator's overview reads from the store: jobs by state and queue, the outbox's
backlog, which worker runs which job, and jobs finished per minute over the last hour.

Every read uses an index (docs/architecture.md, "Store"): the active states by
``(lifecycle_status, created_at)``, the finished ones within a window of ``created_at``, the
throughput by ``finished_at`` (the last hour only), so an overview costs the same with a year of
history behind it. The queue's own figures (depth, live
consumers) come from the queue; the caller puts the two together.
"""

import datetime
from dataclasses import dataclass

import peewee

from ...core.models import AiJob, OutboxEvent
from ...core.outbox import DEAD, PENDING, PROCESSING
from ...core.states import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED

ACTIVE = (QUEUED, RUNNING)
FINISHED = (SUCCEEDED, FAILED, CANCELLED)
STATES = ACTIVE + FINISHED
# Finished jobs are counted over this window of creation times (an index range, not the table).
COUNT_WINDOW = datetime.timedelta(hours=24)
MAX_RUNNING_LISTED = 500


@dataclass(frozen=True)
class Minute:
    """One bar of the throughput chart."""

    start: datetime.datetime  # naive UTC
    succeeded: int
    failed: int
    cancelled: int

    @property
    def finished(self):
        return self.succeeded + self.failed + self.cancelled

    @property
    def failure_rate(self):
        """Failed over finished, 0..1; None when nothing finished."""
        return self.failed / self.finished if self.finished else None


class Overview:
    """Reads for the dashboard's overview page; each method is one or two indexed queries."""

    def __init__(self, store):
        self.store = store

    def state_counts(self, now):
        """``{(queue, state): count}``: every queued and running job, and the jobs finished
        among those created in the COUNT_WINDOW before ``now``."""
        counts = {}
        active = AiJob.lifecycle_status.in_(ACTIVE)
        finished = AiJob.lifecycle_status.in_(FINISHED) & (AiJob.created_at >= now - COUNT_WINDOW)
        for condition in (active, finished):
            query = (
                AiJob.select(AiJob.queue_name, AiJob.lifecycle_status, peewee.fn.COUNT(AiJob.id))
                .where(condition)
                .group_by(AiJob.queue_name, AiJob.lifecycle_status)
                .tuples()
            )
            for queue_name, state, count in query:
                counts[(queue_name, state)] = int(count)
        return counts

    def outbox_counts(self):
        """``{'pending': n, 'processing': n, 'dead': n}`` of the outbox."""
        wanted = (PENDING, PROCESSING, DEAD)
        query = (
            OutboxEvent.select(OutboxEvent.status, peewee.fn.COUNT(OutboxEvent.id))
            .where(OutboxEvent.status.in_(wanted))
            .group_by(OutboxEvent.status)
            .tuples()
        )
        counts = dict.fromkeys(wanted, 0)
        counts.update((status, int(count)) for status, count in query)
        return counts

    def running_by_worker(self):
        """``{locked_by: [job, …]}`` of the running jobs (at most MAX_RUNNING_LISTED), oldest
        lock first."""
        query = (
            AiJob.select(
                AiJob.id,
                AiJob.job_type,
                AiJob.queue_name,
                AiJob.progress,
                AiJob.attempt_no,
                AiJob.locked_by,
                AiJob.locked_at,
                AiJob.lock_until,
            )
            .where(AiJob.lifecycle_status == RUNNING)
            .order_by(AiJob.locked_at)
            .limit(MAX_RUNNING_LISTED)
        )
        workers = {}
        for job in query:
            workers.setdefault(job.locked_by, []).append(job)
        return workers

    def throughput(self, now, minutes=60):
        """One Minute per minute of the last ``minutes`` before ``now``, oldest first."""
        end = now.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
        start = end - datetime.timedelta(minutes=minutes)
        bucket = self._minute_of(AiJob.finished_at)
        query = (
            AiJob.select(bucket.alias('minute'), AiJob.lifecycle_status, peewee.fn.COUNT(AiJob.id))
            .where((AiJob.finished_at >= start) & AiJob.lifecycle_status.in_(FINISHED))
            .group_by(bucket, AiJob.lifecycle_status)
            .tuples()
        )
        found = {}
        for minute, state, count in query:
            found.setdefault(str(minute)[:16], {})[state] = int(count)
        bars = []
        for i in range(minutes):
            at = start + datetime.timedelta(minutes=i)
            counts = found.get(at.strftime('%Y-%m-%d %H:%M'), {})
            done = [counts.get(state, 0) for state in (SUCCEEDED, FAILED, CANCELLED)]
            bars.append(Minute(at, *done))
        return bars

    def _minute_of(self, column):
        """SQL for ``column``'s minute as 'YYYY-MM-DD HH:MM' in this database's dialect."""
        if self.store.dialect == 'mysql':
            return peewee.fn.DATE_FORMAT(column, '%Y-%m-%d %H:%i')
        return peewee.fn.strftime('%Y-%m-%d %H:%M', column)
