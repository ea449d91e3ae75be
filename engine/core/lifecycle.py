"""AiJobLifecycleRepository: the only code that writes ``ai_job.lifecycle_status`` (contracts §1.4).

Every write is one compare-and-set UPDATE whose WHERE clause holds both the legal source states of
the edge (contracts §1.2) and, for a running job, the fence of the worker that holds it
(architecture decision 3). When the UPDATE matches no row nothing was written, and the row is read
once to say why: an edge contracts §1.3 forbids raises ``IllegalTransitionError``; a lost race or a
stale fence raises ``JobLockConflictError``.
"""

import functools
import logging
from dataclasses import dataclass
from enum import Enum

from . import admission, history
from .errors import (
    FinishWrittenError,
    IllegalTransitionError,
    JobAlreadyCancelledError,
    JobCancelledError,
    JobLockConflictError,
    JobNotCancellableError,
    JobNotFoundError,
)
from .history import NewEvent, insert_events
from .logs import log_event
from .models import AiJob, AiJobEvent, AiJobSnapshot
from .outbox import OutboxRepository
from .sql import (
    Statement,
    insert_row,
    job_from_row,
    placeholders,
    send,
    statement,
    write_row,
)


class Status(str, Enum):
    QUEUED = 'queued'
    RUNNING = 'running'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    CANCELLED = 'cancelled'

    def __str__(self):
        return self.value


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (s.value for s in Status)
TERMINAL = frozenset((SUCCEEDED, FAILED, CANCELLED))

# contracts §1.2, plus running → running: a lock takeover after a worker died (architecture decision
# 4).
LEGAL_EDGES = frozenset(
    (
        (QUEUED, RUNNING),
        (QUEUED, CANCELLED),
        (RUNNING, RUNNING),
        (RUNNING, SUCCEEDED),
        (RUNNING, FAILED),
        (RUNNING, CANCELLED),
    )
)

# contracts §1.5: legacy status names, still accepted on input filters (architecture decision 9).
LEGACY_STATUS_TO_LIFECYCLE = {
    'pending': QUEUED,
    'processing': RUNNING,
    'completed': SUCCEEDED,
    'failed': FAILED,
    'cancelled': CANCELLED,
    'cancel_requested': CANCELLED,
}


# ------------------------------------------------------------ the hot path's statements (sql.py)
CREATE_COLUMNS = (
    'id',
    'lifecycle_status',
    'queue_name',
    'priority',
    'progress',
    'user_id',
    'job_type',
    'target_type',
    'target_id',
    'idempotency_key',
    'request_fingerprint',
    'credential_mode',
    'credential_id',
    'prompt_version',
    'output_schema_version',
    'attempt_no',
    'retry_count',
    'max_retry_count',
    'retry_of_job_id',
)
INSERT_JOB_HEAD = 'INSERT INTO ai_job (%s, created_at, updated_at) VALUES ' % ', '.join(
    CREATE_COLUMNS
)
INSERT_JOB_ROW = '(%s, {now}, {now})' % placeholders(len(CREATE_COLUMNS))

# What running a job needs of its row (each column read costs the driver time to describe).
RUN_COLUMNS = (
    'id',
    'lifecycle_status',
    'queue_name',
    'priority',
    'user_id',
    'job_type',
    'target_type',
    'target_id',
    'credential_mode',
    'credential_id',
    'prompt_version',
    'output_schema_version',
    'attempt_no',
    'retry_count',
    'max_retry_count',
    'locked_by',
    'defer_count',  # a job never deferred has nothing waiting for it (a provider batch's line)
    'created_at',  # with started_at: the queue wait the metrics observe at the first lock
    'started_at',
)
SELECT_JOB_AND_SNAPSHOT = Statement(
    'SELECT %s, s.content FROM ai_job j LEFT JOIN ai_job_snapshot s ON s.job_id = j.id '
    'WHERE j.id = %%s' % ', '.join('j.' + name for name in RUN_COLUMNS)
)
# {attempts_left} is filled per repository from its queues' attempt limits, {ids} with ``id = %s``
# or an IN list.
LOCK_JOB = (
    "UPDATE ai_job SET lifecycle_status = 'running', locked_by = %s, locked_at = {now}, "
    'lock_until = {now_plus}, started_at = COALESCE(started_at, {now}), '
    'attempt_no = attempt_no + 1, updated_at = {now} '
    "WHERE {ids} AND (lifecycle_status = 'queued' OR (lifecycle_status = 'running' "
    'AND lock_until < {now} AND cancel_requested_at IS NULL AND ({attempts_left})))'
)
# After a batch lock (MariaDB has no UPDATE … RETURNING): the rows of the batch this instance
# holds, with their snapshots and lock times (lock_jobs tells this lock's rows by their time).
_SELECT_LOCKED = (
    'SELECT %s, j.locked_at, s.content FROM ai_job j '
    'LEFT JOIN ai_job_snapshot s ON s.job_id = j.id '
    "WHERE j.id IN (%%s) AND j.locked_by = %%%%s AND j.lifecycle_status = 'running'"
    % ', '.join('j.' + name for name in RUN_COLUMNS)
)
# The history rows of a batch lock, written by the database in the lock's own round trip: one
# per row the UPDATE just before it changed (``ROW_COUNT()`` is that UPDATE's count, so a lock
# that took nothing writes nothing), told from rows this instance held before by their lock
# time, as lock_jobs tells them (``started`` for a first attempt, ``taken_over`` after).
_INSERT_LOCK_EVENTS = (
    'INSERT INTO ai_job_event (job_id, kind, attempt_no, detail, created_at) '
    "SELECT j.id, CASE WHEN j.attempt_no = 1 THEN '%s' ELSE '%s' END, j.attempt_no, %%%%s, "
    '{now} FROM ai_job j WHERE ROW_COUNT() > 0 AND j.id IN (%%s) AND j.locked_by = %%%%s '
    "AND j.lifecycle_status = 'running' AND j.locked_at = (SELECT MAX(h.locked_at) FROM ai_job h "
    "WHERE h.id IN (%%s) AND h.locked_by = %%%%s AND h.lifecycle_status = 'running')"
    % (history.STARTED, history.TAKEN_OVER)
)
_SELECT_SNAPSHOTS = 'SELECT job_id, content FROM ai_job_snapshot WHERE job_id IN (%s)'
# MariaDB (Store.guards_row_counts), right after a terminal UPDATE: its refusal (fewer rows
# changed than its jobs) as an error of the server's, which stops the statements after it and
# the COMMIT that may end them, as the UPDATE's receive (_check_finished) would have.
_REFUSE_SHORT_FINISH = Statement(
    'BEGIN NOT ATOMIC IF ROW_COUNT() < %s THEN '
    "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'aijob: terminal write refused'; END IF; END"
)
# Jobs one batch lock takes at most (a bound on its IN list).
LOCK_BATCH = 100
_ATTEMPT = RUN_COLUMNS.index('attempt_no')
CANCELLED_VALUES = {'error_code': 'CANCELLED', 'public_error_message': 'The job was cancelled.'}
# Terminal writes per UPDATE in a group commit (a bound on its size and parameter count).
FINISH_BATCH = 100
# Held jobs per heartbeat statement (a bound on the statement's size and its IN list).
EXTEND_BATCH = 500


def _fenced_update(sets, fence_sql, extra_condition=None, count=1, table='ai_job'):
    """``UPDATE <table> SET <sets>`` for ``count`` running jobs, each only while its fence
    holds. Parameters: the sets', then each job's id and fence parameters (the ORed ids make a
    primary-key range)."""
    fences = ' OR '.join(['(id = %%s AND %s)' % fence_sql] * count)
    where = "lifecycle_status = 'running' AND (%s)" % fences
    if extra_condition:
        where += ' AND ' + extra_condition
    return statement('UPDATE %s SET %s WHERE %s' % (table, sets, where))


# One job's terminal UPDATE that also takes it off its user's admission counter (MySQL's
# multi-table UPDATE; a user without counters, from before them, has only the job changed).
RELEASING = 'ai_job LEFT JOIN ai_user_admission a ON a.user_id = ai_job.user_id'


def _finish_update(columns, fence_sql, extra_condition, count, releasing=False):
    """running → terminal for ``count`` jobs in one UPDATE, each under its own fence: sets
    ``lifecycle_status``, then each of ``columns`` per job (``CASE id``), and with
    ``releasing`` (one job, MySQL) its user's ``active`` counter. Parameters: the status, each
    column's (id, value) pairs, then each job's id and fence parameters."""
    case = 'CASE id%s END' % (' WHEN %s THEN %s' * count)
    per_job = ''.join('%s = %s, ' % (name, case) for name in columns)
    sets = 'lifecycle_status = %%s, %sfinished_at = {now}, lock_until = NULL, updated_at = {now}'
    sets %= per_job
    if releasing:
        sets += ', a.active = a.active - 1'
    return _fenced_update(
        sets, fence_sql, extra_condition, count, RELEASING if releasing else 'ai_job'
    )


def is_legal(from_status, to_status):
    return (from_status, to_status) in LEGAL_EDGES


@dataclass(frozen=True)
class Fence:
    """The worker that holds a running job: its instance and the attempt it locked."""

    instance_id: str
    attempt_no: int

    def sql(self, store):
        """The condition as plain SQL: (text, parameters)."""
        return 'locked_by = %s AND attempt_no = %s', (self.instance_id, self.attempt_no)

    def actor(self):
        """Who writes under this fence, for the history (``worker`` is admin-only detail)."""
        return {'worker': self.instance_id}


@dataclass(frozen=True)
class ExpiredLockFence:
    """The reaper's fence: the attempt it saw, and only while that lock has been expired for
    ``expired_for_ms`` — a worker that heartbeats in the meantime wins."""

    attempt_no: int
    expired_for_ms: int

    def sql(self, store):
        return 'attempt_no = %s AND lock_until < {now_plus}', (
            self.attempt_no,
            store.ms_param(-self.expired_for_ms),
        )

    def actor(self):
        return {'by': 'reaper'}


class AiJobLifecycleRepository:
    def __init__(self, store, lock_ttl_ms=60_000, queue_attempts=None, outbox=None):
        self.store = store
        # Every terminal write adds its ai.job.<status> event in the same transaction
        # (architecture decision 15).
        self.outbox = outbox or OutboxRepository(store)
        self.lock_ttl_ms = lock_ttl_ms
        # Locks a job may take in all, per queue (contracts §3.1 "attempts"); takeovers stop there.
        self.queue_attempts = dict(queue_attempts or {'ai-interactive': 2, 'ai-background': 3})
        # The lock CAS; its takeover clause depends on the queues' attempt limits. A lock that
        # ended in a deferral was no attempt: it does not count (defer_count).
        attempts_left = ' OR '.join(
            "(queue_name = '%s' AND attempt_no - defer_count < %d)" % (name, count)
            for name, count in sorted(self.queue_attempts.items())
        )
        self._lock_text = LOCK_JOB.replace('{attempts_left}', attempts_left or 'FALSE')
        self._lock_statement = Statement(self._lock_text.replace('{ids}', 'id = %s'))

    # ------------------------------------------------------------ create
    def create_job(
        self,
        tx,
        *,
        job_id,
        user_id,
        job_type,
        queue_name,
        priority,
        target_type,
        target_id,
        idempotency_key,
        request_fingerprint,
        credential_mode,
        credential_id=None,
        prompt_version=None,
        output_schema_version=None,
        max_retry_count=0,
        retry_of_job_id=None,
    ):
        """Insert a job in ``queued``, inside the caller's transaction ``tx`` (the caller writes
        the outbox event in the same one). Returns the job as written: the row joins the other
        rows of a ``rows_together()`` block (the creates of a group commit: one INSERT), and the
        job's creation time is filled in when it went out (returned by the INSERT, or on MySQL
        read back in the same round trip)."""
        assert tx is not None and self.store.in_transaction(), 'create_job needs a transaction'
        values = dict(
            id=job_id,
            lifecycle_status=QUEUED,
            queue_name=queue_name,
            priority=priority,
            progress=0,
            user_id=user_id,
            job_type=job_type,
            target_type=target_type,
            target_id=target_id,
            idempotency_key=idempotency_key,
            request_fingerprint=request_fingerprint,
            credential_mode=credential_mode,
            credential_id=credential_id,
            prompt_version=prompt_version,
            output_schema_version=output_schema_version,
            attempt_no=0,
            retry_count=0,
            max_retry_count=max_retry_count,
            retry_of_job_id=retry_of_job_id,
        )
        params = tuple(values[name] for name in CREATE_COLUMNS)
        job = AiJob(__no_default__=True, **values)

        def receive(returned):
            job.created_at = job.updated_at = AiJob.created_at.python_value(returned[1])

        returning = ('id, created_at', job_id, receive)
        read_back = not self.store.insert_returns()  # MySQL: a SELECT in the same round trip
        insert_row(
            INSERT_JOB_HEAD, INSERT_JOB_ROW, params, returning=returning, read_back=read_back
        )
        return job

    # ------------------------------------------------------------ lock, heartbeat, progress
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
            statement(_SELECT_LOCKED % placeholders(len(job_ids))), job_ids + [instance_id]
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
            insert_events(self.store, [_lock_row(row[0], row[_ATTEMPT], detail) for row in rows])
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
            self.store.execute(
                statement(_SELECT_SNAPSHOTS % placeholders(len(ids))), ids
            ).fetchall()
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
                statement(_INSERT_LOCK_EVENTS % (marks, marks)),
                [detail] + ids + [instance_id] + ids + [instance_id],
                None,
            ),
            (statement(_SELECT_LOCKED % marks), ids + [instance_id], _fetchall),
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
            self.store.execute(
                statement(
                    'UPDATE ai_job SET lock_until = {now_plus} WHERE id IN (%s) '
                    "AND lifecycle_status = 'running' AND locked_by = %%s" % marks
                ),
                [ttl] + ids + [instance_id],
            )
            rows = self.store.execute(
                statement(
                    'SELECT id, lifecycle_status, locked_by, attempt_no, cancel_requested_at '
                    'FROM ai_job WHERE id IN (%s)' % marks
                ),
                ids,
            ).fetchall()
            holders.update((row[0], tuple(row[1:])) for row in rows)
        return holders

    def release_lock(self, job_id, fence):
        """Let the lock expire now (a stopping worker hands the job back); the job stays
        running, and the next worker to pop it takes it over (architecture decision 4)."""
        self._fenced(job_id, fence, 'lock_until = {now}')

    def defer(self, job_id, fence, delay_ms, reason, detail=None, wake_by=None):
        """The lock holder hands the job back until ``delay_ms`` from now (a rate limit or a
        budget said wait; contracts §1.8): the job stays ``running`` with no holder
        (``locked_by`` NULL) and ``lock_until`` at its wake time, so no lock takes it before
        then and the reaper does not take it for lost; ``defer_count`` + 1, so the next lock is
        no attempt of the queue's; no retry is spent. In one transaction with the history's
        ``deferred`` row and the durable wake-up (an outbox event due at that time, claimed by
        ``wake_by`` when that process pushes it itself). Refused once a cancel was requested
        (JobCancelledError: the holder finishes the job cancelled) or when the fence no longer
        holds (JobLockConflictError). Returns the wake-up event."""
        delay_ms = max(0, int(delay_ms))
        fence_sql, fence_params = fence.sql(self.store)
        update = _fenced_update(
            'locked_by = NULL, lock_until = {now_plus}, defer_count = defer_count + 1, '
            'updated_at = {now}',
            fence_sql,
            'cancel_requested_at IS NULL',
        )
        params = (self.store.ms_param(delay_ms), job_id) + fence_params
        event_detail = {'reason': reason, 'delayMs': delay_ms, **(detail or {}), **fence.actor()}
        event = NewEvent(job_id, history.DEFERRED, fence.attempt_no, event_detail)

        def write(tx):
            if self.store.execute(update, params).rowcount != 1:
                job = self.get(job_id)
                held = (job.locked_by, job.attempt_no) == (fence.instance_id, fence.attempt_no)
                if job.lifecycle_status == RUNNING and held and job.cancel_requested_at:
                    raise JobCancelledError('cancel requested before the deferral')
                raise JobLockConflictError(job_id, 'lock lost')
            insert_events(self.store, [event])
            job = (
                AiJob.select(
                    AiJob.id, AiJob.job_type, AiJob.queue_name, AiJob.priority, AiJob.attempt_no
                )
                .where(AiJob.id == job_id)
                .get()
            )
            return self.outbox.create_wake_event(tx, job, delay_ms, claimed_by=wake_by)

        return self._in_transaction(write)

    def set_progress(self, job_id, fence, progress, milestone=False):
        """Record progress (0–100) of a running job; only its lock holder may. It never goes
        back: a retried call or a takeover starts its own count again from 0. ``milestone``:
        the caller's attempt reached a new multiple of ten, which the history keeps."""
        progress = max(0, min(100, int(progress)))
        sets = 'progress = CASE WHEN progress < %s THEN %s ELSE progress END, updated_at = {now}'
        if not milestone:
            return self._fenced(job_id, fence, sets, (progress, progress))
        event = NewEvent(job_id, history.PROGRESS, fence.attempt_no, {'progress': progress})
        self._in_transaction(
            lambda tx: self._fenced(job_id, fence, sets, (progress, progress), [event])
        )

    def count_retry(self, job_id, fence, retry_no, error=None, backoff_ms=0):
        """The engine schedules call ``retry_no`` + 1 of the provider after ``error`` (a
        JobFailure), in ``backoff_ms``: ``retry_count`` becomes ``retry_no`` (set, not added
        to: a write tried again after its answer was lost counts the retry once), and the
        history's ``retry_scheduled`` row."""
        detail = {'retryNo': retry_no, 'backoffMs': int(backoff_ms)}
        if error is not None:
            detail.update(errorCode=error.code, internalMessage=str(error)[:2000])
        detail.update(fence.actor())
        event = NewEvent(job_id, history.RETRY_SCHEDULED, fence.attempt_no, detail)
        self._in_transaction(
            # updated_at changes the row even when retry_count has that value already (MySQL
            # counts changed rows, and an unchanged row would read as a lost lock).
            lambda tx: self._fenced(
                job_id, fence, 'retry_count = %s, updated_at = {now}', (retry_no,), [event]
            )
        )

    def _fenced(self, job_id, fence, sets, set_params=(), events=()):
        """The fenced UPDATE, then ``events`` (in the caller's transaction)."""
        fence_sql, fence_params = fence.sql(self.store)
        update = _fenced_update(sets, fence_sql)
        if self.store.execute(update, set_params + (job_id,) + fence_params).rowcount != 1:
            raise JobLockConflictError(job_id, 'lock lost')
        if events:
            insert_events(self.store, events)

    # ------------------------------------------------------------ terminal states
    def mark_succeeded(self, job_id, *, fence, output_hash=None):
        """running → succeeded, only for the lock holder and only if nobody asked to cancel."""
        self._finish(
            job_id,
            SUCCEEDED,
            fence,
            {'progress': 100, 'output_hash': output_hash},
            'cancel_requested_at IS NULL',
        )

    def mark_failed(self, job_id, error, *, fence):
        """running → failed with the error's code, public and internal messages."""
        values = {
            'error_code': error.code,
            'public_error_message': (error.public_message or '')[:512],
            'internal_error_message': str(error)[:8000],
        }
        detail = {
            'errorCode': error.code,
            'message': values['public_error_message'],
            'internalMessage': str(error)[:2000],
        }
        self._finish(job_id, FAILED, fence, values, detail=detail)

    def mark_cancelled(self, job_id, *, fence=None):
        """Without a fence (the owner cancels): queued → cancelled at once, running → cancel
        requested (the engine finishes it); returns the job. With a fence (the engine or the
        reaper): running → cancelled, once a cancel was requested."""
        if fence is not None:
            return self._finish(
                job_id,
                CANCELLED,
                fence,
                CANCELLED_VALUES,
                'cancel_requested_at IS NOT NULL',
                detail={'errorCode': 'CANCELLED'},
            )
        if self._in_transaction(lambda tx: self._cancel_queued(tx, job_id)):
            return self.get(job_id)
        if self._in_transaction(lambda tx: self._cancel_deferred(tx, job_id)):
            return self.get(job_id)
        return self.request_cancel(job_id)

    def _cancelled_now(self):
        """The columns of a job cancelled at once, by ``_cancel_queued`` or ``_cancel_deferred``
        (nobody holds it, so nobody else would finish it)."""
        now = self.store.now()
        return {
            AiJob.error_code: 'CANCELLED',
            AiJob.public_error_message: CANCELLED_VALUES['public_error_message'],
            AiJob.cancel_requested_at: now,
            AiJob.finished_at: now,
            AiJob.lifecycle_status: CANCELLED,
            AiJob.updated_at: now,
        }

    def _cancel_queued(self, tx, job_id):
        """queued → cancelled with its terminal event; False if the job was not queued."""
        changed = (
            AiJob.update(self._cancelled_now())
            .where((AiJob.id == job_id) & (AiJob.lifecycle_status == QUEUED))
            .execute()
        )
        if changed:
            self.outbox.create_terminal_event(tx, job_id, CANCELLED)
            admission.release(self.store, [job_id])
            # Nothing ever locked a queued job: attempt 0.
            insert_events(
                self.store, [NewEvent(job_id, history.CANCELLED, 0, {'errorCode': 'CANCELLED'})]
            )
        return bool(changed)

    def _cancel_deferred(self, tx, job_id):
        """running → cancelled at once for a deferred job (no holder: nobody else would finish
        it), with its terminal event; False if the job was not waiting deferred. The CAS on
        ``locked_by IS NULL`` races the wake-up's lock: one of them wins."""
        values = self._cancelled_now()
        values[AiJob.lock_until] = None  # it held the wake time: a cancelled job waits for nothing
        changed = (
            AiJob.update(values)
            .where(
                (AiJob.id == job_id)
                & (AiJob.lifecycle_status == RUNNING)
                & AiJob.locked_by.is_null()
                & AiJob.cancel_requested_at.is_null()
            )
            .execute()
        )
        if changed:
            self.outbox.create_terminal_event(tx, job_id, CANCELLED)
            admission.release(self.store, [job_id])
            attempt_no = AiJob.select(AiJob.attempt_no).where(AiJob.id == job_id).scalar()
            detail = {'errorCode': 'CANCELLED', 'while': 'deferred'}
            insert_events(self.store, [NewEvent(job_id, history.CANCELLED, attempt_no, detail)])
        return bool(changed)

    def request_cancel(self, job_id):
        """Set ``cancel_requested_at`` on a running job (idempotent). Returns the job."""

        def write(tx):
            changed = (
                AiJob.update({AiJob.cancel_requested_at: self.store.now()})
                .where(
                    (AiJob.id == job_id)
                    & (AiJob.lifecycle_status == RUNNING)
                    & AiJob.cancel_requested_at.is_null()
                )
                .execute()
            )
            job = self.get(job_id)
            if changed:
                event = NewEvent(job_id, history.CANCEL_REQUESTED, job.attempt_no, {})
                insert_events(self.store, [event])
            return changed, job

        changed, job = self._in_transaction(write)
        if changed or (job.lifecycle_status == RUNNING and job.cancel_requested_at):
            return job
        raise self._refusal(job_id, CANCELLED, job)

    def transition(self, job_id, to_status, *, instance_id=None, fence=None, error=None):
        """Move a job to ``to_status`` through the named method for that edge and return it as
        it is now. Nothing enters ``queued`` except ``create_job``, so that target always
        raises."""
        if to_status == RUNNING:
            return self.lock_job(job_id, instance_id)
        if to_status == SUCCEEDED:
            self.mark_succeeded(job_id, fence=fence)
        elif to_status == FAILED:
            self.mark_failed(job_id, error, fence=fence)
        elif to_status == CANCELLED and fence is None:
            return self.mark_cancelled(job_id)
        elif to_status == CANCELLED:
            self.mark_cancelled(job_id, fence=fence)
        else:
            raise self._refusal(job_id, to_status)
        return self.get(job_id)

    # ------------------------------------------------------------ reads
    def get(self, job_id):
        job = AiJob.get_or_none(AiJob.id == job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    def find_by_lifecycle_status(self, statuses, queue_name=None, limit=100):
        query = AiJob.select().where(AiJob.lifecycle_status.in_([str(s) for s in statuses]))
        if queue_name:
            query = query.where(AiJob.queue_name == queue_name)
        return list(query.order_by(AiJob.created_at).limit(limit))

    def find_expired_locks(self, threshold_ms, limit=100):
        """Running jobs whose lock expired more than ``threshold_ms`` ago (contracts §1.7)."""
        return list(
            AiJob.select()
            .where(
                (AiJob.lifecycle_status == RUNNING)
                & (AiJob.lock_until < self.store.now_plus_ms(-threshold_ms))
            )
            .order_by(AiJob.lock_until)
            .limit(limit)
        )

    def find_stale_queued(self, older_than_ms, limit=100):
        """Jobs still queued ``older_than_ms`` after their last update (the reconciler's input)."""
        return list(
            AiJob.select()
            .where(
                (AiJob.lifecycle_status == QUEUED)
                & (AiJob.updated_at < self.store.now_plus_ms(-older_than_ms))
            )
            .order_by(AiJob.created_at)
            .limit(limit)
        )

    def touch_queued(self, job_ids):
        """Mark queued jobs as just re-published, so the reconciler waits again before the next."""
        if job_ids:
            AiJob.update({AiJob.updated_at: self.store.now()}).where(
                AiJob.id.in_(list(job_ids)) & (AiJob.lifecycle_status == QUEUED)
            ).execute()

    def record_worker_lost(self, job):
        """The reaper is about to hand ``job`` (as it read it: lock expired) to another worker:
        its history says so, once per attempt however many sweeps push it again. The fenced
        touch of the row checks the lock is still expired at that attempt (else
        JobLockConflictError: it heartbeated or was taken over meanwhile) and holds the row, so
        this row always comes before the takeover it leads to. Returns whether it wrote one."""
        fence = ExpiredLockFence(job.attempt_no, 0)
        detail = {'worker': job.locked_by, 'by': 'reaper'}
        event = NewEvent(job.id, history.WORKER_LOST, job.attempt_no, detail)

        def write(tx):
            self._fenced(job.id, fence, 'updated_at = {now}')
            seen = (
                AiJobEvent.select(AiJobEvent.id)
                .where(
                    (AiJobEvent.job_id == job.id)
                    & (AiJobEvent.kind == history.WORKER_LOST)
                    & (AiJobEvent.attempt_no == job.attempt_no)
                )
                .exists()
            )
            if not seen:
                insert_events(self.store, [event])
            return not seen

        return self._in_transaction(write)

    def attempts_allowed(self, queue_name):
        return self.queue_attempts.get(queue_name, 1)

    def attempts_left(self, job):
        """May ``job`` (as read) be locked once more? Deferrals are no attempts."""
        used = job.attempt_no - (job.defer_count or 0)
        return used < self.attempts_allowed(job.queue_name)

    # ------------------------------------------------------------ internals
    def _finish(self, job_id, to_status, fence, values, extra_condition=None, detail=None):
        """The fenced running → terminal write with its outbox event and its history row
        (``detail`` plus who wrote it); nothing is read back. Raises the refusal when the CAS
        matched nothing. In a group commit the terminal writes of the group go out as one
        UPDATE at its end (sql.rows_together); one refused fails them all, and the group runs
        again with each job's UPDATE on its own, where the refusal is that job's."""
        fence_sql, fence_params = fence.sql(self.store)
        shape = (to_status, tuple(values), fence_sql, extra_condition)
        finish = (job_id, tuple(values.values()), fence_params)
        event = NewEvent(job_id, to_status, fence.attempt_no, {**(detail or {}), **fence.actor()})

        def write(tx):
            try:
                write_row(shape, finish, lambda finishes: self._plan_finishes(shape, finishes))
            except _Refused:  # written at once (alone): the refusal is this job's
                raise self._refusal(job_id, to_status, fence=fence) from None
            self.outbox.create_terminal_event(tx, job_id, to_status)
            insert_events(self.store, [event])

        self._in_transaction(write)

    def _plan_finishes(self, shape, finishes):
        """The terminal UPDATEs of ``finishes`` (job id, values, fence parameters) of one
        ``shape``, FINISH_BATCH per statement, each with its jobs' admission counters (in the
        same statement for one job on MySQL, else one UPDATE after it), planned for sql.send;
        each raises unless it matched every job of its chunk (_Refused for a lone job), and on
        MariaDB is followed by _REFUSE_SHORT_FINISH, so that the server stops there too and a
        COMMIT sent with these rows never runs after a refusal."""
        to_status, columns, fence_sql, extra_condition = shape
        guarded = self.store.guards_row_counts()
        planned = []
        for start in range(0, len(finishes), FINISH_BATCH):
            chunk = finishes[start : start + FINISH_BATCH]
            releasing = len(chunk) == 1 and self.store.dialect == 'mysql'
            update = _finish_update(columns, fence_sql, extra_condition, len(chunk), releasing)
            params = [to_status]
            for i in range(len(columns)):
                for job_id, values, _ in chunk:
                    params += (job_id, values[i])
            for job_id, _, fence_params in chunk:
                params += (job_id,) + fence_params
            check = functools.partial(_check_finished, [job_id for job_id, _, _ in chunk])
            planned.append((update, params, check))
            if guarded:
                planned.append((_REFUSE_SHORT_FINISH, (len(chunk),), None))
            if not releasing:
                # Sent even when the UPDATE fell short: that fails, and rolls back, the group.
                planned += admission.plan_release(self.store, [job_id for job_id, _, _ in chunk])
        return planned

    def _in_transaction(self, work):
        """``work(tx)`` in the caller's transaction (the PROJECT transaction of a success, or
        a group commit), else in one of its own: a terminal status never commits without its
        event, nor an event without its status."""
        if self.store.in_transaction():
            return work(True)
        with self.store.atomic() as tx:
            return work(tx)

    def _refusal(self, job_id, to_status, job=None, fence=None):
        """Why a CAS toward ``to_status`` matched nothing, as the error to raise. With the
        ``fence`` of a terminal write: FinishWrittenError when that same fence already wrote
        the same status (an earlier try committed, its answer lost with the connection)."""
        job = job or self.get(job_id)
        current = job.lifecycle_status
        if fence is not None and current == to_status and self._finished_under(job, fence):
            return FinishWrittenError(job_id, current)
        if to_status == CANCELLED and current == CANCELLED:
            return JobAlreadyCancelledError(job_id, current, to_status)
        if to_status == CANCELLED and current in TERMINAL:
            return JobNotCancellableError(job_id, current, to_status)
        if not is_legal(current, to_status):
            return IllegalTransitionError(job_id, current, to_status)
        if to_status == SUCCEEDED and job.cancel_requested_at is not None:
            return JobCancelledError('cancel requested before the result was committed')
        return JobLockConflictError(job_id)

    def _finished_under(self, job, fence):
        """Did ``fence`` write ``job``'s terminal status? Its history row says who did."""
        actor = fence.actor().items()
        return any(
            event.kind == job.lifecycle_status
            and event.attempt_no == fence.attempt_no
            and actor <= event.detail.items()
            for event in history.JobHistory(self.store).list(job.id)
        )


def _update_and_read(update, params, select, select_params):
    """An UPDATE and a read in one round trip (sql.send): the read goes whatever the UPDATE
    changed. Returns (rows the UPDATE changed, rows read)."""
    return send([(update, params, _rowcount), (select, select_params, _fetchall)])


def _rowcount(cursor):
    return cursor.rowcount


def _fetchall(cursor):
    return cursor.fetchall()


class _Refused(Exception):
    """A lone job's terminal UPDATE matched nothing (why is read once the results are in)."""


def _check_finished(job_ids, cursor):
    """sql.send's receive of a terminal UPDATE: every job of ``job_ids`` matched. On MySQL a
    lone job's UPDATE also changes its admission counters' row, which counts too."""
    matched = cursor.rowcount
    if len(job_ids) == 1:
        if matched < 1:
            raise _Refused(job_ids[0])
        return
    if matched != len(job_ids):
        # Whose it was shows when the group commit writes each job's UPDATE on its own.
        raise RuntimeError(
            '%d of %d terminal writes refused' % (len(job_ids) - matched, len(job_ids))
        )


def lock_event(job, instance_id):
    """The history row of a lock: ``started`` for the first attempt, ``taken_over`` for a later
    one (the previous holder died, stalled or handed the job back)."""
    return _lock_row(job.id, job.attempt_no, {'worker': instance_id})


def _held_jobs(rows):
    """_SELECT_LOCKED's rows as [(job, snapshot content)]."""
    content = AiJobSnapshot.content.python_value
    return [(job_from_row(RUN_COLUMNS, row[:-2]), content(row[-1])) for row in rows]


def _lock_row(job_id, attempt_no, detail):
    kind = history.STARTED if attempt_no == 1 else history.TAKEN_OVER
    return NewEvent(job_id, kind, attempt_no, detail)
