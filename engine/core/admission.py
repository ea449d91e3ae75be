"""Per-user admission (contracts §7.3: TOO_MANY_JOBS, QUOTA_EXCEEDED): each user's unfinished jobs
and jobs created this UTC day, kept as counters in ``ai_user_admission`` by the transactions that
change a job's status, so a create reads and bumps one row instead of counting the user's jobs.

Exact under racing creates: a create's upsert locks its user's row until its transaction ends, so
creates of one user (in any thread, group commit or process) are admitted one after another, each
against the counts the previous one left. Exact through crashes: a create counts itself (+1 to
both) in its own transaction, and every terminal write (the engine's, the reaper's, a cancel's)
takes its job off ``active`` in the transaction that writes the terminal status; a rollback undoes
both. The daily count is kept with its day and starts again at 1 on a create of another day."""

import datetime

from .errors import QuotaExceededError, TooManyJobsError
from .sql import ROWS_PER_INSERT, Statement, placeholders, send, statement, write_row

_INSERT = (
    'INSERT INTO ai_user_admission (user_id, active, day, created_on_day, last_job_id) '
    'VALUES (%s, 1, {today}, 1, %s) '
)
# Parameters: the user, the job, then each limit twice (0: no limit). A refused create changes
# nothing; an admitted one makes itself the row's last_job_id, which is how it learns it was
# admitted. MySQL evaluates the assignments left to right, each seeing the ones before.
_ADMIT_MYSQL = _INSERT + (
    'ON DUPLICATE KEY UPDATE '
    'last_job_id = IF((%s = 0 OR active < %s) AND '
    '(%s = 0 OR day <> {today} OR created_on_day < %s), VALUES(last_job_id), last_job_id), '
    'created_on_day = IF(last_job_id = VALUES(last_job_id), '
    'IF(day = {today}, created_on_day + 1, 1), created_on_day), '
    'day = IF(last_job_id = VALUES(last_job_id), {today}, day), '
    'active = active + (last_job_id = VALUES(last_job_id))'
)
_ADMIT_SQLITE = _INSERT + (
    'ON CONFLICT (user_id) DO UPDATE SET active = active + 1, '
    'created_on_day = CASE WHEN day = {today} THEN created_on_day + 1 ELSE 1 END, '
    'day = {today}, last_job_id = excluded.last_job_id '
    'WHERE (%s = 0 OR active < %s) AND (%s = 0 OR day <> {today} OR created_on_day < %s) '
    'RETURNING last_job_id'
)
ADMIT_RETURNING = Statement(_ADMIT_MYSQL + ' RETURNING last_job_id', _ADMIT_SQLITE)
ADMIT = Statement(_ADMIT_MYSQL)  # MySQL, which has no INSERT … RETURNING: read back
# MariaDB, with the table's CHECK constraint in force: the create always counts itself, and
# writes the limits it is held to; a count past one fails the constraint, so the upsert itself
# is the refusal (an error, changing nothing) and has no answer to read. Parameters: the user,
# the job, the active limit, the daily limit.
LIMITS_CHECK = 'admission_within_limits'
LIMITS_CONDITION = (  # as in schema.sql; initdb adds it to a table from before it (store.py)
    '(active_limit = 0 OR active <= active_limit) '
    'AND (daily_limit = 0 OR created_on_day <= daily_limit)'
)
ADMIT_CHECKED = Statement(
    'INSERT INTO ai_user_admission '
    '(user_id, active, day, created_on_day, last_job_id, active_limit, daily_limit) '
    'VALUES (%s, 1, {today}, 1, %s, %s, %s) ON DUPLICATE KEY UPDATE '
    'created_on_day = IF(day = {today}, created_on_day + 1, 1), day = {today}, '
    'active = active + 1, last_job_id = VALUES(last_job_id), '
    'active_limit = VALUES(active_limit), daily_limit = VALUES(daily_limit)'
)
LAST_ADMITTED = Statement('SELECT last_job_id FROM ai_user_admission WHERE user_id = %s')
COUNTS = Statement(
    'SELECT active, CASE WHEN day = {today} THEN created_on_day ELSE 0 END '
    'FROM ai_user_admission WHERE user_id = %s'
)


def _release(count):
    """``active`` less the jobs of ``count`` ids, per user: the jobs' users are
    read from ai_job by the statement itself (a terminal write does not read its job back)."""
    ids = placeholders(count)
    jobs = 'SELECT user_id, COUNT(*) AS n FROM ai_job WHERE id IN (%s) GROUP BY user_id' % ids
    return statement(
        'UPDATE ai_user_admission a JOIN (%s) f ON f.user_id = a.user_id '
        'SET a.active = a.active - f.n' % jobs,
        'UPDATE ai_user_admission SET active = active - (SELECT COUNT(*) FROM ai_job '
        'WHERE id IN (%s) AND ai_job.user_id = ai_user_admission.user_id) '
        'WHERE user_id IN (SELECT user_id FROM ai_job WHERE id IN (%s))' % (ids, ids),
    )


class NotAdmitted(Exception):
    """A create's count would pass a limit (which one is read afterwards, on its own)."""


def refuses_by_error(store):
    """Is a refused count an error of its own statement (the CHECK constraint, MariaDB), so
    that nothing read back decides it: a create's writes may then end with their COMMIT
    (sql.rows_together's ``ends_transaction``)."""
    return store.enforces_check('ai_user_admission', LIMITS_CHECK)


def count_create(store, user_id, job_id, max_active=0, daily_quota=0):
    """In the create's transaction: count job ``job_id`` for ``user_id`` unless that would pass
    a limit (0: none), in which case NotAdmitted is raised. The count goes out with the
    transaction's other writes (sql.write_row): at once, or at the end of the enclosing
    ``rows_together()`` block, which is then where the refusal comes from (NotAdmitted, or
    where the limits are a CHECK constraint, the statement's error)."""
    planned = _plan_count(store, user_id, job_id, max_active, daily_quota)
    try:
        # Each create's count is a statement of its own (a refusal must not change the others).
        write_row(('admit', job_id), None, lambda rows: planned, last=True)  # locks the user's row
    except Exception as exc:  # sent at once: the constraint's refusal is this create's
        if store.is_check_failure(exc, LIMITS_CHECK):
            raise NotAdmitted(user_id) from None
        raise


def _plan_count(store, user_id, job_id, max_active, daily_quota):
    if refuses_by_error(store):
        return [(ADMIT_CHECKED, (user_id, job_id, max_active, daily_quota), None)]
    params = (user_id, job_id, max_active, max_active, daily_quota, daily_quota)

    def counted(cursor):
        row = cursor.fetchone()
        if row is None or row[0] != job_id:
            raise NotAdmitted(user_id)

    if store.insert_returns():
        return [(ADMIT_RETURNING, params, counted)]
    return [(ADMIT, params, None), (LAST_ADMITTED, (user_id,), counted)]


def release(store, job_ids):
    """In the transaction that made jobs ``job_ids`` terminal (each was queued or running):
    take them off their users' ``active``."""
    send(plan_release(store, job_ids))


def plan_release(store, job_ids):
    """``release`` as statements planned for sql.send."""
    job_ids = list(job_ids)
    twice = store.dialect == 'sqlite'  # MySQL names the ids once (a join), SQLite twice
    planned = []
    for start in range(0, len(job_ids), ROWS_PER_INSERT):
        chunk = job_ids[start : start + ROWS_PER_INSERT]
        planned.append((_release(len(chunk)), chunk * 2 if twice else chunk, None))
    return planned


class Admission:
    """The per-user limits, checked where the create counts itself (``admit``)."""

    def __init__(self, store, ai, *, max_active_per_user, daily_quota):
        self.store = store
        self.ai = ai
        self.max_active_per_user = max_active_per_user  # 0: no limit
        self.daily_quota = daily_quota  # 0: no limit

    @classmethod
    def from_config(cls, config, store, ai):
        return cls(
            store,
            ai,
            max_active_per_user=config.max_active_jobs_per_user,
            daily_quota=config.daily_job_quota,
        )

    def check_creatable(self, request, definition):
        """What refuses a create without reading the store (PLATFORM_UNAVAILABLE, an unknown
        prompt version)."""
        self.ai.check_creatable(definition, request.overrides or {})

    def admit(self, user_id, job_id):
        """In the create's transaction: count the job, or raise the limit it would pass."""
        limits = (self.max_active_per_user, self.daily_quota)
        try:
            count_create(self.store, user_id, job_id, *limits)
            return
        except NotAdmitted:
            pass
        active, created_today = self.store.execute(COUNTS, (user_id,)).fetchone()
        self.check(int(active), int(created_today))
        raise TooManyJobsError('user %s was refused at the edge of a limit' % user_id)

    def check(self, active, created_today):
        """Raises the limit that ``active`` unfinished and ``created_today`` jobs reach."""
        if self.max_active_per_user and active >= self.max_active_per_user:
            raise TooManyJobsError(
                'user has %d unfinished jobs (limit %d)' % (active, self.max_active_per_user)
            )
        if self.daily_quota and created_today >= self.daily_quota:  # the database's UTC day
            now = self.store.clock()
            next_day = now.replace(hour=0, minute=0, second=0, microsecond=0) + datetime.timedelta(
                days=1
            )
            raise QuotaExceededError(retry_after_s=max(1, int((next_day - now).total_seconds())))


# ---------------------------------------------------------------- upgrade
BACKFILL = Statement(
    'INSERT INTO ai_user_admission (user_id, active, day, created_on_day, last_job_id) '
    "SELECT user_id, SUM(lifecycle_status IN ('queued', 'running')), {today}, "
    "SUM(created_at >= {today}), '' FROM ai_job "
    "WHERE lifecycle_status IN ('queued', 'running') OR created_at >= {today} GROUP BY user_id"
)
ANY_COUNTERS = Statement('SELECT 1 FROM ai_user_admission LIMIT 1')


def backfill(store):
    """A deployment upgraded to the counters (``initdb``): while the table is still empty, the
    counts of the jobs it already has. Jobs that older processes still running create or finish
    before they are replaced are not counted."""
    if store.execute(ANY_COUNTERS).fetchone() is None:
        store.execute(BACKFILL)
