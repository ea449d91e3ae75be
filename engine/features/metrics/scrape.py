"""A Prometheus scrape: the counters (counters.py) plus the gauges that are read from the store
and the queue when the scrape happens, so every process shows the same shared state and none has
to keep it up to date: the kernel's here, the features' from the ``gauges`` hook point. Three
small queries and one Redis pipeline per queue, plus the busiest users' reads (a few ranges of
one index per user, core/busiest_users.py); nothing here scans a growing table (the outbox and
running-job reads use their status indexes and only touch unfinished rows, the users' waits only
the jobs started in the last minutes)."""

import datetime

from peewee import Case, fn
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from ...core.busiest_users import MAX_WAITS, QUANTILES, WAIT_WINDOW, busiest_users
from ...core.models import AiJob, LeaderLease, OutboxEvent
from ...core.outbox import DEAD, FAILED, PENDING, PROCESSING, WAKE_EVENT
from ...core.registry import QUEUE_NAMES
from ...dispatch.leader import HOUSEKEEPING
from . import counters
from .processes import multiprocess_dir

# Outbox rows not yet published (claimed ones included) and not given up.
UNPUBLISHED = (PENDING, PROCESSING, FAILED)
CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'


class StateCollector:
    """Gauges of shared state, read at collect time; the caller holds a store connection."""

    def __init__(self, store, queue):
        self.store = store
        self.queue = queue

    def collect(self):
        yield from self._outbox()
        yield from self._queues()
        yield self._running()
        yield self._leader()
        yield from self._busiest_users()

    def _outbox(self):
        pending = GaugeMetricFamily(
            'aijob_outbox_pending_events', 'Outbox events not yet published.'
        )
        dead = GaugeMetricFamily(
            'aijob_outbox_dead_events', 'Outbox events given up after their last attempt.'
        )
        oldest = GaugeMetricFamily(
            'aijob_outbox_oldest_pending_age_seconds',
            'Age of the oldest pending outbox event (0 when none is pending).',
        )
        waiting, given_up, first = 0, 0, None
        rows = (
            OutboxEvent.select(
                OutboxEvent.status,
                fn.COUNT(OutboxEvent.id),
                # A deferred job's wake-up is waiting for its time, not for a push: its age
                # counts from when it is due.
                fn.MIN(
                    Case(
                        OutboxEvent.event_type,
                        [(WAKE_EVENT, OutboxEvent.available_at)],
                        OutboxEvent.created_at,
                    )
                ),
            )
            .where(OutboxEvent.status.in_(UNPUBLISHED + (DEAD,)))
            .group_by(OutboxEvent.status)
            .tuples()
        )
        for status, count, created in rows:
            if status == DEAD:
                given_up = count
                continue
            waiting += count
            created = _datetime(created)
            first = created if first is None else min(first, created)
        pending.add_metric([], waiting)
        dead.add_metric([], given_up)
        age = 0.0
        if first is not None:
            age = max(0.0, (self.store.clock() - first).total_seconds())
        oldest.add_metric([], age)
        return pending, dead, oldest

    def _queues(self):
        depth = GaugeMetricFamily(
            'aijob_queue_depth', 'Messages waiting in a queue shard.', labels=('queue', 'shard')
        )
        processing = GaugeMetricFamily(
            'aijob_queue_processing',
            "Messages held in consumers' processing lists of a queue shard.",
            labels=('queue', 'shard'),
        )
        for queue_name in QUEUE_NAMES:
            for shard, (waiting, held) in sorted(self.queue.shard_lengths(queue_name).items()):
                depth.add_metric([queue_name, shard], waiting)
                processing.add_metric([queue_name, shard], held)
        return depth, processing

    def _running(self):
        running = GaugeMetricFamily(
            'aijob_jobs_running', 'Jobs running, per worker instance.', labels=('worker',)
        )
        rows = (
            AiJob.select(AiJob.locked_by, fn.COUNT(AiJob.id))
            .where(AiJob.lifecycle_status == 'running')
            .group_by(AiJob.locked_by)
            .tuples()
        )
        for worker, count in rows:
            running.add_metric([worker or ''], count)
        return running

    def _leader(self):
        """The housekeeping lease (architecture decision 12), one primary-key read: alert when
        no holder has time left for longer than AIJOB_LEADER_LEASE_MS."""
        remaining = GaugeMetricFamily(
            'aijob_leader_lease_remaining_seconds',
            "Time left on the housekeeping leader's lease (0 or less: no live leader).",
            labels=('holder',),
        )
        row = LeaderLease.get_or_none(LeaderLease.name == HOUSEKEEPING)
        if row is not None:
            left = (_datetime(row.expires_at) - self.store.clock()).total_seconds()
            remaining.add_metric([row.holder], left)
        return remaining

    def _busiest_users(self):
        """The busiest users (core/busiest_users.py): labelled by user id, for the
        BUSIEST_USERS first only, so a scrape holds at most that many users' series."""
        label = ('user',)
        waiting = GaugeMetricFamily(
            'aijob_user_jobs_waiting', 'Queued jobs of the busiest users.', labels=label
        )
        running = GaugeMetricFamily(
            'aijob_user_jobs_running', 'Running jobs of the busiest users.', labels=label
        )
        oldest = GaugeMetricFamily(
            'aijob_user_oldest_waiting_seconds',
            "Age of the busiest users' oldest queued job (0 when none waits).",
            labels=label,
        )
        wait = GaugeMetricFamily(
            'aijob_user_queue_wait_seconds',
            "Create to first lock of the busiest users' jobs started in the last %d s "
            '(nearest-rank quantiles).' % WAIT_WINDOW.total_seconds(),
            labels=('user', 'quantile'),
        )
        started = GaugeMetricFamily(
            'aijob_user_queue_wait_jobs',
            "The busiest users' jobs started in the last %d s that the quantiles are over "
            '(at most %d).' % (WAIT_WINDOW.total_seconds(), MAX_WAITS),
            labels=label,
        )
        for load in busiest_users(self.store):
            user = [load.user_id]
            waiting.add_metric(user, load.waiting)
            running.add_metric(user, load.running)
            oldest.add_metric(user, load.oldest_waiting_s)
            started.add_metric(user, load.waits)
            for q, seconds in zip(QUANTILES, (load.wait_p50_s, load.wait_p95_s), strict=True):
                if seconds is not None:  # no start in the window: no quantile
                    wait.add_metric(user + [str(q)], seconds)
        return waiting, running, oldest, wait, started


def _datetime(value):
    if isinstance(value, str):  # SQLite hands back text
        return datetime.datetime.fromisoformat(value)
    return value


class _Families:
    """This process's own families, when no multiprocess directory sums them."""

    def collect(self):
        for family in counters.FAMILIES:
            if family.metric is not None:
                yield from family.metric.collect()


class _Gauges:
    """The features' gauges (the ``gauges`` hook point), read at collect time."""

    def __init__(self, read):
        self._read = read

    def collect(self):
        return self._read()


def scrape(runtime):
    """The text of one scrape of ``runtime`` (the caller holds a store connection)."""
    return exposition(runtime.store, runtime.queue, runtime.hooks.gauges)


def exposition(store, queue, gauges=()):
    """The text of one scrape (the caller holds a store connection); ``gauges``: the
    features' ``read()`` of state at scrape time."""
    registry = CollectorRegistry(auto_describe=False)
    for read in gauges:
        registry.register(_Gauges(read))
    if multiprocess_dir() is not None:
        MultiProcessCollector(registry)
    else:
        registry.register(_Families())
    registry.register(StateCollector(store, queue))
    return generate_latest(registry)
