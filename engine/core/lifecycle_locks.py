"""The lock: queued → running, or a takeover of a running job whose lock expired (contracts
§1.6), and the heartbeat that keeps a lock (§1.7). A part of AiJobLifecycleRepository
(core/lifecycle.py), which gives it ``store``, ``lock_ttl_ms``, the lock statement for its
queues' attempt limits (``_lock_text``, ``_lock_statement``), ``get``, ``_in_transaction`` and
``_refusal``.

A lock is one compare-and-set UPDATE with its history rows (``started`` or ``taken_over``) in
one transaction, and on MariaDB/MySQL in one round trip with the read of what it took.
"""

import logging

from . import history
from .history import NewEvent, insert_events
from .lifecycle_sql import (
    ATTEMPT,
    EXTEND_BATCH,
    EXTEND_LOCKS,
    INSERT_LOCK_EVENTS,
    LOCK_BATCH,
    READ_HOLDERS,
    RUN_COLUMNS,
    SELECT_JOB_AND_SNAPSHOT,
    SELECT_LOCKED,
    SELECT_SNAPSHOTS,
)
from .logs import log_event
from .models import AiJobEvent, AiJobSnapshot
from .sql import job_from_row, placeholders, send, statement
from .states import RUNNING


class LockWrites:
    """AiJobLifecycleRepository's locks and heartbeat."""

    def lock_job(self, job_id, instance_id, lock_ttl_ms=None):
        """queued → running (CAS), or take over a running job whose lock expired while its queue
        allows another attempt. Returns the whole row; ``job.attempt_no`` is the new fence."""
        self.lock_job_with_snapshot(job_id, instance_id, lock_ttl_ms)
        return self.get(job_id)

    def lock_job_with_snapshot(self, job_id, instance_id, lock_ttl_ms=None):
        """The engine's ``lock_job``: the CAS UPDATE and, in the same round trip, one read of
        what running the job needs (RUN_COLUMNS) with its snapshot content (None if it has
        none)."""
        ttl = self.store.ms_param(lock_ttl_ms or self.lock_ttl_ms)

        def write(tx):
            params = (instance_id, ttl, job_id)
            changed, rows = _update_and_read(
                self._lock_statement, params, SELECT_JOB_AND_SNAPSHOT, (job_id,)
            )
            if changed != 1:
                raise self._refusal(job_id, RUNNING)
            row = rows[0]
            job = job_from_row(RUN_COLUMNS, row[:-1])
            insert_events(self.store, [lock_event(job, instance_id)])
            return job, AiJobSnapshot.content.python_value(row[-1])

        return self._in_transaction(write)

    def lock_jobs(self, job_ids, instance_id, lock_ttl_ms=None, adopt=()):
        """``lock_job_with_snapshot`` for several jobs: one CAS UPDATE over all of them, their
        rows and their history rows, in one transaction. Returns [(job, snapshot content)] for
        the jobs this call locked, in ``job_ids``' order; the others (locked elsewhere,
        finished, gone) are left out, as a refused ``lock_job`` would be. At most LOCK_BATCH
        ids per call.

        ``adopt``: ids of ``job_ids`` an earlier lock of ``instance_id`` may have taken without
        its caller hearing so (execution/unheard_locks.py); those of them running and held by
        ``instance_id`` are returned too, as they are (their history row was that lock's)."""
        ids = list(dict.fromkeys(job_ids))  # a duplicate message: one lock
        assert len(ids) <= LOCK_BATCH, 'lock at most LOCK_BATCH jobs at once'
        if not ids:
            return []
        ttl = self.store.ms_param(lock_ttl_ms or self.lock_ttl_ms)
        marks = placeholders(len(ids))
        update = self._lock_text.replace('{ids}', 'id IN (%s)' % marks)
        params = [instance_id, ttl] + ids

        if self.store.dialect == 'sqlite':
            locked = self._lock_returning(update, params, instance_id)
        else:
            # In a transaction of its own, the lock is one round trip: BEGIN, the UPDATE, its
            # history rows, the read and the COMMIT.
            own = not self.store.in_transaction()
            locked = self._in_transaction(
                lambda tx: self._lock_then_read(update, params, ids, instance_id, commit=own)
            )
        taken = {job.id for job, _ in locked}
        adopted = [job_id for job_id in ids if job_id in adopt and job_id not in taken]
        if adopted:
            locked += self._held_by(adopted, instance_id)
        order = {job_id: i for i, job_id in enumerate(ids)}
        return sorted(locked, key=lambda pair: order[pair[0].id])

    def _held_by(self, job_ids, instance_id):
        """[(job, snapshot content)] for the jobs of ``job_ids`` running and held by
        ``instance_id``, whatever lock took them."""
        rows = self.store.execute(
            statement(SELECT_LOCKED % placeholders(len(job_ids))), job_ids + [instance_id]
        ).fetchall()
        return _held_jobs(rows)

    def _lock_returning(self, update, params, instance_id):
        """SQLite: the UPDATE returns exactly the rows it changed; with their history rows it
        commits, and only then are the rows made jobs and their snapshots read: SQLite has one
        writer, so its write lock is held for the two statements and little Python."""
        statement_ = statement(update + ' RETURNING ' + ', '.join(RUN_COLUMNS))
        detail = {'worker': instance_id}

        def write(tx):
            rows = self.store.execute(statement_, params).fetchall()
            insert_events(self.store, [_lock_row(row[0], row[ATTEMPT], detail) for row in rows])
            return rows

        rows = self._in_transaction(write)
        return self._with_snapshots([job_from_row(RUN_COLUMNS, row) for row in rows])

    def _with_snapshots(self, jobs):
        """[(job, snapshot content)] for ``jobs``, their snapshots read in one statement."""
        if not jobs:
            return []
        ids = [job.id for job in jobs]
        content = AiJobSnapshot.content.python_value
        snapshots = dict(
            self.store.execute(statement(SELECT_SNAPSHOTS % placeholders(len(ids))), ids).fetchall()
        )
        return [(job, content(snapshots.get(job.id))) for job in jobs]

    def _lock_then_read(self, update, params, ids, instance_id, commit=False):
        """MariaDB/MySQL, in one round trip (sql.send, with the transaction's COMMIT when
        ``commit``): the UPDATE, the history rows of the rows it changed, and one read of the
        batch's rows this instance holds, joined with their snapshots. A row this instance held
        before (a lock it still has, or handed back, from an earlier attempt) is told from this
        lock's by ``locked_at``: the database clock is read once per statement, so this lock's
        rows share one time, later than any earlier statement's."""
        marks = placeholders(len(ids))
        detail = AiJobEvent.detail.db_value({'worker': instance_id})
        planned = [
            (statement(update), params, _rowcount),
            (
                statement(INSERT_LOCK_EVENTS % (marks, marks)),
                [detail] + ids + [instance_id] + ids + [instance_id],
                None,
            ),
            (statement(SELECT_LOCKED % marks), ids + [instance_id], _fetchall),
        ]
        changed, _, rows = send(planned, commit=commit)
        if changed == 0:
            return []
        latest = max(row[-2] for row in rows)
        rows = [row for row in rows if row[-2] == latest]
        if len(rows) != changed:  # the clock went back: no row can be told for sure
            # The jobs stay locked, unrun, until their locks expire and the reaper takes them.
            log_event('job.batch_lock_unclear', logging.WARNING, locked=changed, matched=len(rows))
            return []
        return _held_jobs(rows)

    def extend_locks(self, job_ids, instance_id, lock_ttl_ms=None):
        """Heartbeat: push ``lock_until`` forward for every running job of ``job_ids`` that
        ``instance_id`` holds, EXTEND_BATCH jobs per UPDATE, then read back who holds each
        (one SELECT per batch). Returns {job id: (status, locked_by, attempt_no,
        cancel_requested_at)}; the caller compares each attempt's own fence. The UPDATE matches
        on the instance, not on attempt numbers: a row it extends is held by this instance
        either way."""
        ttl = self.store.ms_param(lock_ttl_ms or self.lock_ttl_ms)
        holders = {}
        for start in range(0, len(job_ids), EXTEND_BATCH):
            ids = list(job_ids[start : start + EXTEND_BATCH])
            marks = placeholders(len(ids))
            self.store.execute(statement(EXTEND_LOCKS % marks), [ttl] + ids + [instance_id])
            rows = self.store.execute(statement(READ_HOLDERS % marks), ids).fetchall()
            holders.update((row[0], tuple(row[1:])) for row in rows)
        return holders


def _update_and_read(update, params, select, select_params):
    """An UPDATE and a read in one round trip (sql.send): the read goes whatever the UPDATE
    changed. Returns (rows the UPDATE changed, rows read)."""
    return send([(update, params, _rowcount), (select, select_params, _fetchall)])


def _rowcount(cursor):
    return cursor.rowcount


def _fetchall(cursor):
    return cursor.fetchall()


def lock_event(job, instance_id):
    """The history row of a lock: ``started`` for the first attempt, ``taken_over`` for a later
    one (the previous holder died, stalled or handed the job back)."""
    return _lock_row(job.id, job.attempt_no, {'worker': instance_id})


def _held_jobs(rows):
    """SELECT_LOCKED's rows as [(job, snapshot content)]."""
    content = AiJobSnapshot.content.python_value
    return [(job_from_row(RUN_COLUMNS, row[:-2]), content(row[-1])) for row in rows]


def _lock_row(job_id, attempt_no, detail):
    kind = history.STARTED if attempt_no == 1 else history.TAKEN_OVER
    return NewEvent(job_id, kind, attempt_no, detail)
