"""The lifecycle's SQL text (core/sql.py's plain statements): the hot path's create, lock,
heartbeat and terminal writes, written once for MySQL/MariaDB and SQLite (``Statement`` swaps
placeholders and the clock), with the bounds on their sizes.

Where the dialects differ the repository picks the text: SQLite and MariaDB return what a
statement wrote (``RETURNING``), MySQL reads it back in the same round trip; MariaDB guards a
terminal UPDATE with an anonymous block (``REFUSE_SHORT_FINISH``), MySQL counts its rows.
"""

from . import history
from .sql import Statement, placeholders, statement

# ------------------------------------------------------------ create
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

# ------------------------------------------------------------ lock
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


def lock_text(queue_attempts):
    """LOCK_JOB for these queues' attempt limits ({queue name: locks a job may take in all}),
    ``{ids}`` left to fill. A lock that ended in a deferral was no attempt: it does not count
    (defer_count)."""
    attempts_left = ' OR '.join(
        "(queue_name = '%s' AND attempt_no - defer_count < %d)" % (name, count)
        for name, count in sorted(queue_attempts.items())
    )
    return LOCK_JOB.replace('{attempts_left}', attempts_left or 'FALSE')


# After a batch lock (MariaDB has no UPDATE … RETURNING): the rows of the batch this instance
# holds, with their snapshots and lock times (lock_jobs tells this lock's rows by their time).
SELECT_LOCKED = (
    'SELECT %s, j.locked_at, s.content FROM ai_job j '
    'LEFT JOIN ai_job_snapshot s ON s.job_id = j.id '
    "WHERE j.id IN (%%s) AND j.locked_by = %%%%s AND j.lifecycle_status = 'running'"
    % ', '.join('j.' + name for name in RUN_COLUMNS)
)
# The history rows of a batch lock, written by the database in the lock's own round trip: one
# per row the UPDATE just before it changed (``ROW_COUNT()`` is that UPDATE's count, so a lock
# that took nothing writes nothing), told from rows this instance held before by their lock
# time, as lock_jobs tells them (``started`` for a first attempt, ``taken_over`` after).
INSERT_LOCK_EVENTS = (
    'INSERT INTO ai_job_event (job_id, kind, attempt_no, detail, created_at) '
    "SELECT j.id, CASE WHEN j.attempt_no = 1 THEN '%s' ELSE '%s' END, j.attempt_no, %%%%s, "
    '{now} FROM ai_job j WHERE ROW_COUNT() > 0 AND j.id IN (%%s) AND j.locked_by = %%%%s '
    "AND j.lifecycle_status = 'running' AND j.locked_at = (SELECT MAX(h.locked_at) FROM ai_job h "
    "WHERE h.id IN (%%s) AND h.locked_by = %%%%s AND h.lifecycle_status = 'running')"
    % (history.STARTED, history.TAKEN_OVER)
)
SELECT_SNAPSHOTS = 'SELECT job_id, content FROM ai_job_snapshot WHERE job_id IN (%s)'
# Jobs one batch lock takes at most (a bound on its IN list).
LOCK_BATCH = 100
ATTEMPT = RUN_COLUMNS.index('attempt_no')

# ------------------------------------------------------------ heartbeat
# Held jobs per heartbeat statement (a bound on the statement's size and its IN list).
EXTEND_BATCH = 500
# Both filled with the placeholders of EXTEND_BATCH ids at most.
EXTEND_LOCKS = (
    "UPDATE ai_job SET lock_until = {now_plus} WHERE id IN (%s) AND lifecycle_status = 'running' "
    'AND locked_by = %%s'
)
READ_HOLDERS = (
    'SELECT id, lifecycle_status, locked_by, attempt_no, cancel_requested_at '
    'FROM ai_job WHERE id IN (%s)'
)

# ------------------------------------------------------------ fenced and terminal writes
# Terminal writes per UPDATE in a group commit (a bound on its size and parameter count).
FINISH_BATCH = 100
# MariaDB (Store.guards_row_counts), right after a terminal UPDATE: its refusal (fewer rows
# changed than its jobs) as an error of the server's, which stops the statements after it and
# the COMMIT that may end them, as the UPDATE's receive (lifecycle_finish.py) would have.
REFUSE_SHORT_FINISH = Statement(
    'BEGIN NOT ATOMIC IF ROW_COUNT() < %s THEN '
    "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'aijob: terminal write refused'; END IF; END"
)


def fenced_update(sets, fence_sql, extra_condition=None, count=1, table='ai_job'):
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


def finish_update(columns, fence_sql, extra_condition, count, releasing=False):
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
    return fenced_update(
        sets, fence_sql, extra_condition, count, RELEASING if releasing else 'ai_job'
    )
