"""Budgets in money (issue 21 item 5): per user, per job type or global, per UTC day, per UTC
month or in total, each with an amount in the units of ``ai_usage_log.cost`` and what happens
when it is spent (``fail`` the job, or ``wait`` until the period resets).

Exact under any concurrency: before each provider call the BudgetGuard *reserves* the call's
maximum cost (the prompt's token bound x prompt price + max_tokens x completion price,
usage.max_call_cost; the bound is openai_client.prompt_token_bound, no tokenizer counts more,
and the call sends that max_tokens) in one transaction that locks the budget rows that apply
(``SELECT … FOR UPDATE`` on MariaDB; SQLite serialises writers at BEGIN IMMEDIATE), checks
``spent + reserved + max <= amount`` for each and counts the reservation; the transaction that
writes the call's usage row settles it (the reservation goes, the real cost is added to
``spent``). A call that does not fit only because of the reservations of calls in flight waits
for them (the job is deferred for a short while, IN_FLIGHT_WAIT_S and doubling); only ``spent +
max > amount`` refuses it. Spend is kept per (budget, period) in ``ai_budget_spend`` in
millionths, so a check reads a few rows, whatever the history. A call is counted in the period
it was reserved in.

A reservation whose worker died before settling is released by the reaper (``release_leaked``)
once its job's lock is gone: the job finished, moved on to another attempt, or its lock expired
``grace_ms`` ago, unless a provider batch still holds the job's call (engine/features/batches/: a
parked call keeps its reservation until its line is answered and used); and a worker that takes
over a job whose lock expired releases the reservations of the job's earlier attempts when it
reserves. Settling and releasing each delete the reservation row first and give back the
reserved amount only when they deleted it, so the two never both give it back.

The engine never imports this module: it joins the kernel as an extension
(``BudgetsExtension``, engine/extensions.py): its guard among the call guards, its create-time
check among the create checks, its release among the reaper's steps."""

import calendar
import datetime
import random
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from decimal import ROUND_UP, Decimal

from ...core.errors import BudgetExceededError
from ...core.logs import log_event
from ...core.models import new_id
from ...core.sql import placeholders, statement
from .models import AiBudget, AiBudgetSpend

SCOPES = ('user', 'jobType', 'global')
PERIODS = ('day', 'month', 'total')
ON_EXCEEDED = ('fail', 'wait')
MICROS = 1_000_000  # ai_usage_log.cost has 6 decimal places: spend is kept in millionths
CACHE_S = 1.0  # how long a process trusts its list of budgets (creates and calls read it)
RELEASE_BATCH = 500
# A call that waits for calls in flight to settle is deferred this long, doubled at each of the
# job's deferrals up to IN_FLIGHT_WAIT_MAX_S (so a long wait costs few locks), give or take a
# quarter (so the jobs deferred together do not all come back together).
IN_FLIGHT_WAIT_S = 0.25
IN_FLIGHT_WAIT_MAX_S = 2.0


def to_micros(amount):
    """Millionths of a Decimal amount, rounded up (a maximum cost is never under-counted)."""
    return int((Decimal(amount) * MICROS).to_integral_value(rounding=ROUND_UP))


def from_micros(micros):
    return (Decimal(int(micros)) / MICROS).quantize(Decimal('0.000001'))


# ---------------------------------------------------------------- periods (UTC, database clock)
def period_key(period, now):
    if period == 'day':
        return now.strftime('d:%Y-%m-%d')
    if period == 'month':
        return now.strftime('m:%Y-%m')
    return 'total'


def period_start(period, now):
    """The first instant of the period ``now`` is in (None: a total has no start)."""
    if period == 'day':
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == 'month':
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


def period_reset(period, now):
    """When the period ``now`` is in ends (None: a total never resets)."""
    start = period_start(period, now)
    if period == 'day':
        return start + datetime.timedelta(days=1)
    if period == 'month':
        return start + datetime.timedelta(days=calendar.monthrange(now.year, now.month)[1])
    return None


def _clock_value(value):
    """A clock read back from SQL: SQLite returns text."""
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    return value


# ---------------------------------------------------------------- budgets as known here
@dataclass(frozen=True)
class Budget:
    id: str
    scope: str
    subject: str
    period: str
    amount_micros: int
    on_exceeded: str

    def applies(self, user_id, job_type):
        """A pre-filter: the SQL that reserves decides. Case-blind, as MariaDB's collation
        compares, so it never leaves out a budget the database would apply."""
        if self.scope == 'global':
            return True
        return self.subject.lower() == (user_id if self.scope == 'user' else job_type).lower()

    def describe(self):
        """How messages name it: ``the daily budget of user u-1 (10.000000)``."""
        when = {'day': 'daily', 'month': 'monthly', 'total': 'total'}[self.period]
        whose = {'global': 'global', 'user': 'user %s' % self.subject}.get(
            self.scope, 'jobType %s' % self.subject
        )
        return 'the %s %s budget (%s)' % (when, whose, from_micros(self.amount_micros))


@dataclass
class Reservation:
    id: int
    amount_micros: int
    spend_ids: tuple


@dataclass
class Exceeded:
    """Why a reservation was refused: the budgets it would pass, and the clock then."""

    budgets: list
    now: datetime.datetime
    max_micros: int

    def must_fail(self):
        """Fail rather than wait: a budget says fail, never resets, or is smaller than the call."""
        return any(
            b.on_exceeded == 'fail' or b.period == 'total' or self.max_micros > b.amount_micros
            for b in self.budgets
        )

    def wait_s(self):
        """Until the last of the exceeded periods resets."""
        resets = [period_reset(b.period, self.now) for b in self.budgets]
        return max((r - self.now).total_seconds() for r in resets)


@dataclass
class InFlight:
    """Why a reservation must wait: the budgets it fits once the calls in flight settle (their
    ``spent + max`` fits; ``spent + reserved + max`` does not)."""

    budgets: list

    def wait_s(self, defer_count):
        """How long the job waits before it tries again, after ``defer_count`` deferrals."""
        wait = min(IN_FLIGHT_WAIT_MAX_S, IN_FLIGHT_WAIT_S * 2 ** min(defer_count, 8))
        return wait * random.uniform(0.75, 1.25)


def refusal_message(budget, now):
    """What the client is told: which budget, and when it resets."""
    named = budget.describe()
    named = named[0].upper() + named[1:]
    reset = period_reset(budget.period, now)
    if reset is None:
        return '%s is spent; it does not reset (an admin may raise or delete it).' % named
    return '%s is spent until it resets at %sZ.' % (named, reset.isoformat(timespec='seconds'))


# ---------------------------------------------------------------- SQL
BUDGET_COLUMNS = 'id, scope, subject, period, amount, on_exceeded'
# The current period's key in SQL, as period_key() makes it from the same clock.
PERIOD_KEY_SQL = {
    'mysql': "CASE b.period WHEN 'day' THEN CONCAT('d:', DATE_FORMAT(UTC_TIMESTAMP(6), "
    "'%%Y-%%m-%%d')) WHEN 'month' THEN CONCAT('m:', DATE_FORMAT(UTC_TIMESTAMP(6), '%%Y-%%m')) "
    "ELSE 'total' END",
    'sqlite': "CASE b.period WHEN 'day' THEN 'd:' || strftime('%Y-%m-%d', 'now') "
    "WHEN 'month' THEN 'm:' || strftime('%Y-%m', 'now') ELSE 'total' END",
}
# The budgets of a job with the clock and their current period's spend row, in one read.
WITH_SPEND = (
    'SELECT b.id, b.scope, b.subject, b.period, b.amount, b.on_exceeded, {now}, '
    's.id, s.spent_micros, s.reserved_micros FROM ai_budget b '
    'LEFT JOIN ai_budget_spend s ON s.budget_id = b.id AND s.period_key = %s '
    "WHERE b.scope = 'global' OR (b.scope = 'user' AND b.subject = %%s) "
    "OR (b.scope = 'jobType' AND b.subject = %%s) ORDER BY b.id"
)
# Read by a create; locked by a call's reservation until its transaction ends.
READ_WITH_SPEND = statement(
    WITH_SPEND % PERIOD_KEY_SQL['mysql'], WITH_SPEND % PERIOD_KEY_SQL['sqlite']
)
LOCK_WITH_SPEND = statement(
    WITH_SPEND % PERIOD_KEY_SQL['mysql'] + ' FOR UPDATE', WITH_SPEND % PERIOD_KEY_SQL['sqlite']
)
ALL_BUDGETS = statement('SELECT %s FROM ai_budget ORDER BY id' % BUDGET_COLUMNS)
INSERT_SPEND = (
    'INSERT INTO ai_budget_spend (budget_id, period_key, spent_micros, reserved_micros, '
    'created_at) VALUES (%s, %s, %s, 0, {now})'
)
INSERT_SPEND_STATEMENT = statement(
    INSERT_SPEND + ' ON DUPLICATE KEY UPDATE id = id', INSERT_SPEND + ' ON CONFLICT DO NOTHING'
)
INSERT_RESERVATION = statement(
    'INSERT INTO ai_budget_reservation (job_id, attempt_no, call_no, amount_micros, spend_ids, '
    'created_at) VALUES (%s, %s, %s, %s, %s, {now})'
)
DELETE_RESERVATION = statement('DELETE FROM ai_budget_reservation WHERE id = %s')
# Reservations whose job's lock is gone: the job is missing or not running, or it runs another
# attempt or its lock expired more than the reaper's grace ago while nothing holds its call (a
# feature that hands a call on, provider batches, adds its condition: Budgets.hold_calls).
LEAKED = (
    'SELECT r.id, r.amount_micros, r.spend_ids FROM ai_budget_reservation r '
    'LEFT JOIN ai_job j ON j.id = r.job_id '
    "WHERE j.id IS NULL OR j.lifecycle_status <> 'running' OR ((j.attempt_no <> r.attempt_no "
    'OR j.lock_until IS NULL OR j.lock_until < {now_plus})%s) '
    'ORDER BY r.id LIMIT %d'
)
EARLIER_ATTEMPTS = statement(
    'SELECT id, amount_micros, spend_ids FROM ai_budget_reservation '
    'WHERE job_id = %s AND attempt_no < %s'
)
USAGE_SUM = 'SELECT COALESCE(SUM(cost), 0) FROM ai_usage_log'
USAGE_FILTER = {'global': '', 'user': 'user_id = %s', 'jobType': 'job_type = %s'}


def _reserve_sql(count):
    return statement(
        'UPDATE ai_budget_spend SET reserved_micros = reserved_micros + %%s WHERE id IN (%s)'
        % placeholders(count)
    )


def _settle_sql(count, released):
    give_back = ', reserved_micros = reserved_micros - %s' if released else ''
    return statement(
        'UPDATE ai_budget_spend SET spent_micros = spent_micros + %%s%s WHERE id IN (%s)'
        % (give_back, placeholders(count))
    )


def _release_sql(count):
    return statement(
        'UPDATE ai_budget_spend SET reserved_micros = reserved_micros - %%s WHERE id IN (%s)'
        % placeholders(count)
    )


def _spend_rows_sql(budgets, keys):
    return statement(
        'SELECT id, budget_id, period_key, spent_micros, reserved_micros FROM ai_budget_spend '
        'WHERE budget_id IN (%s) AND period_key IN (%s)'
        % (placeholders(budgets), placeholders(keys))
    )


def _with_spend(rows):
    """(budgets, clock, {(budget id, period key): (spend id, spent, reserved)}) of rows of
    WITH_SPEND; a budget whose current period has no spend row yet is left out of the dict."""
    now = _clock_value(rows[0][6])
    budgets = [_budget_from_row(row) for row in rows]
    spend = {
        (budget.id, period_key(budget.period, now)): (int(row[7]), int(row[8]), int(row[9]))
        for budget, row in zip(budgets, rows, strict=True)
        if row[7] is not None
    }
    return budgets, now, spend


def _reservation_from_row(row):
    """A Reservation from (id, amount_micros, spend_ids)."""
    return Reservation(int(row[0]), int(row[1]), tuple(int(i) for i in row[2].split(',') if i))


def _budget_from_row(row):
    return Budget(row[0], row[1], row[2], row[3], to_micros(str(row[4])), row[5])


# ---------------------------------------------------------------- the ledger
class Budgets:
    """The budget tables: the admin's create/replace/delete/list, the reservation of a call's
    maximum cost, its settlement and release, and the create-time check."""

    def __init__(self, store, cache_s=CACHE_S, clock=time.monotonic):
        self.store = store
        self.cache_s = cache_s
        self._clock = clock
        self._cache = None  # (read at, [Budget])
        self._cache_lock = threading.Lock()
        # A unit of database work outside a transaction, as the engine takes them: a pooled
        # connection on MySQL; SQLite keeps one per thread.
        self._unit = store.connection if store.dialect == 'mysql' else nullcontext
        # SQL conditions on a reservation ``r`` that say its call is still out (see LEAKED).
        self._holds = []

    def hold_calls(self, condition):
        """Keep a dead worker's reservation while ``condition`` (SQL on the reservation ``r``:
        an EXISTS, say) holds: the call was handed on and its answer is still to be used."""
        self._holds.append(condition)

    def _leaked(self):
        held = ''.join(' AND NOT (%s)' % condition for condition in self._holds)
        return statement(LEAKED % (held, RELEASE_BATCH))

    # -- the per-process list
    def all(self):
        """Every budget, as read at most ``cache_s`` ago (one read a second per process)."""
        cached = self._cache
        if cached is not None and self._clock() - cached[0] < self.cache_s:
            return cached[1]
        with self._cache_lock:
            cached = self._cache
            if cached is None or self._clock() - cached[0] >= self.cache_s:
                with self._unit():
                    rows = self.store.execute(ALL_BUDGETS).fetchall()
                cached = self._cache = (self._clock(), [_budget_from_row(r) for r in rows])
        return cached[1]

    def applicable(self, user_id, job_type):
        return [b for b in self.all() if b.applies(user_id, job_type)]

    def forget(self):
        self._cache = None

    # -- admin
    def put(self, scope, subject, period, amount, on_exceeded):
        """Create the budget of (scope, subject, period), or replace its amount and behaviour.
        Returns (AiBudget, created)."""

        def work(tx):
            now = self.store.clock()
            existing = AiBudget.get_or_none(
                (AiBudget.scope == scope)
                & (AiBudget.subject == subject)
                & (AiBudget.period == period)
            )
            created = existing is None
            budget = existing or AiBudget(
                id=new_id(), scope=scope, subject=subject, period=period, created_at=now
            )
            budget.amount, budget.on_exceeded, budget.updated_at = amount, on_exceeded, now
            budget.save(force_insert=created)
            # The current period's spend so far, so a budget set mid-period counts it.
            self._ensure_spend([_budget_from_row(self._row(budget))], now)
            return budget, created

        try:
            return self.store.run_in_transaction(work)
        finally:
            self.forget()

    def delete(self, budget_id):
        def work(tx):
            deleted = AiBudget.delete().where(AiBudget.id == budget_id).execute()
            AiBudgetSpend.delete().where(AiBudgetSpend.budget_id == budget_id).execute()
            return bool(deleted)

        try:
            return self.store.run_in_transaction(work)
        finally:
            self.forget()

    def listing(self):
        """[(Budget, AiBudget row, spent micros, reserved micros, now)] for each budget's current
        period, by scope, subject and period."""
        now = self.store.clock()
        rows = list(AiBudget.select().order_by(AiBudget.scope, AiBudget.subject, AiBudget.period))
        budgets = [_budget_from_row(self._row(row)) for row in rows]
        spend = self._spend(budgets, now)
        listed = []
        for row, budget in zip(rows, budgets, strict=True):
            found = spend.get((budget.id, period_key(budget.period, now)))
            spent, reserved = (found[1], found[2]) if found else (0, 0)
            listed.append((budget, row, spent, reserved, now))
        return listed

    @staticmethod
    def _row(model):
        return (
            model.id,
            model.scope,
            model.subject,
            model.period,
            model.amount,
            model.on_exceeded,
        )

    # -- the create-time check
    def check_creatable(self, user_id, job_type):
        """Refuse a create (BudgetExceededError, 429) when a budget that applies is spent:
        ``spent >= amount`` (what calls in flight reserved may yet be left unspent). Free when
        no budget applies (the list is cached)."""
        if not self.applicable(user_id, job_type):
            return
        rows = self.store.execute(READ_WITH_SPEND, (user_id, job_type)).fetchall()
        if not rows:
            return
        budgets, now, spend = _with_spend(rows)
        spent = []
        for budget in budgets:
            found = spend.get((budget.id, period_key(budget.period, now)))
            if found is not None and found[1] >= budget.amount_micros:
                spent.append(budget)
        if not spent:
            return
        # The one that keeps refusing longest: a total first, else the latest reset.
        worst = max(spent, key=lambda b: period_reset(b.period, now) or datetime.datetime.max)
        reset = period_reset(worst.period, now)
        retry_after = None if reset is None else max(1, int((reset - now).total_seconds()) + 1)
        raise BudgetExceededError(refusal_message(worst, now), retry_after_s=retry_after)

    # -- reservations
    def reserve(self, job, call_no, max_micros):
        """Reserve ``max_micros`` against every budget that applies to ``job``, in one
        transaction that locks them. Returns a Reservation, None when no budget applies any
        more, an Exceeded when ``spent + max_micros`` passes a budget, or an InFlight when only
        the reservations of calls in flight leave no room (nothing reserved for either)."""
        with self._unit():
            return self.store.run_in_transaction(lambda tx: self._reserve(job, call_no, max_micros))

    def _reserve(self, job, call_no, max_micros):
        rows = self.store.execute(LOCK_WITH_SPEND, (job.user_id, job.job_type)).fetchall()
        if not rows:
            return None
        budgets, now, spend = _with_spend(rows)
        # A takeover: this worker holds the job's lock now, so the reservations of its earlier
        # attempts (a dead worker's) are released before the reaper gets to them.
        if job.attempt_no > 1 and self._release_earlier_attempts(job):
            spend = self._spend(budgets, now)
        if len(spend) < len(budgets):  # a period's first call: its spend row is made now
            spend = self._ensure_spend(budgets, now)
        ids, exceeded, crowded = [], [], []
        for budget in budgets:
            spend_id, spent, reserved = spend[(budget.id, period_key(budget.period, now))]
            ids.append(spend_id)
            if spent + max_micros > budget.amount_micros:
                exceeded.append(budget)
            elif spent + reserved + max_micros > budget.amount_micros:
                crowded.append(budget)
        if exceeded:
            return Exceeded(exceeded, now, max_micros)
        if crowded:
            return InFlight(crowded)
        self.store.execute(_reserve_sql(len(ids)), [max_micros, *ids])
        cursor = self.store.execute(
            INSERT_RESERVATION,
            (job.id, job.attempt_no, call_no, max_micros, ','.join(map(str, ids))),
        )
        return Reservation(cursor.lastrowid, max_micros, tuple(ids))

    def settle(self, reservation, cost):
        """In the transaction that writes the call's usage row: the reservation goes and the
        call's real ``cost`` counts as spent (two statements)."""
        released = self.store.execute(DELETE_RESERVATION, (reservation.id,)).rowcount == 1
        params = [to_micros(cost)]
        if released:
            params.append(reservation.amount_micros)
        ids = reservation.spend_ids
        self.store.execute(_settle_sql(len(ids), released), params + list(ids))

    def add_spend(self, user_id, job_type, cost):
        """In the caller's transaction: ``cost`` counted as spent by every budget that applies
        to a job of ``user_id`` and ``job_type``, with no reservation (a provider batch line
        the provider billed for a job that was cancelled before it used it). Call it before
        writing the cost's usage row: a period's spend row made here starts from the usage
        already recorded."""
        rows = self.store.execute(LOCK_WITH_SPEND, (user_id, job_type)).fetchall()
        if not rows:
            return
        budgets, now, spend = _with_spend(rows)
        if len(spend) < len(budgets):
            spend = self._ensure_spend(budgets, now)
        ids = [spend[(b.id, period_key(b.period, now))][0] for b in budgets]
        self.store.execute(_settle_sql(len(ids), False), [to_micros(cost), *ids])

    def release(self, reservation):
        """Give a reservation back, in a transaction of its own (the call was not made)."""
        with self._unit():
            self.store.run_in_transaction(lambda tx: self._release(reservation))

    def _release(self, reservation):
        if self.store.execute(DELETE_RESERVATION, (reservation.id,)).rowcount != 1:
            return False  # settled or released already
        ids = reservation.spend_ids
        self.store.execute(_release_sql(len(ids)), [reservation.amount_micros, *ids])
        return True

    def _release_earlier_attempts(self, job):
        rows = self.store.execute(EARLIER_ATTEMPTS, (job.id, job.attempt_no)).fetchall()
        return sum(self._release(_reservation_from_row(row)) for row in rows)

    def release_leaked(self, grace_ms):
        """The reaper's pass: release the reservations whose job's lock is gone (see the
        module's docstring). Returns how many were released."""
        released = 0
        while True:
            rows = self.store.execute(self._leaked(), (self.store.ms_param(-grace_ms),)).fetchall()
            for row in rows:
                leaked = _reservation_from_row(row)
                released += self.store.run_in_transaction(lambda tx, r=leaked: self._release(r))
            if len(rows) < RELEASE_BATCH:
                break
        if released:
            log_event('reaper.reservations_released', count=released)
        return released

    # -- spend rows
    def _spend(self, budgets, now):
        """{(budget id, period key): (spend id, spent, reserved)} of the budgets' rows."""
        if not budgets:
            return {}
        ids = sorted({b.id for b in budgets})
        keys = sorted({period_key(b.period, now) for b in budgets})
        rows = self.store.execute(_spend_rows_sql(len(ids), len(keys)), ids + keys).fetchall()
        return {(r[1], r[2]): (int(r[0]), int(r[3]), int(r[4])) for r in rows}

    def _ensure_spend(self, budgets, now):
        """``_spend``, after creating the rows of the budgets' current periods that are missing,
        each starting from the period's recorded usage. Runs inside a transaction that holds
        the budgets' rows, so no two create the same row."""
        spend = self._spend(budgets, now)
        missing = [b for b in budgets if (b.id, period_key(b.period, now)) not in spend]
        if not missing:
            return spend
        for budget in missing:
            spent = self._recorded_usage(budget, now)
            self.store.execute(
                INSERT_SPEND_STATEMENT, (budget.id, period_key(budget.period, now), spent)
            )
        return self._spend(budgets, now)

    def _recorded_usage(self, budget, now):
        """Millionths recorded in ai_usage_log for the budget's scope in its current period."""
        conditions, params = [], []
        if USAGE_FILTER[budget.scope]:
            conditions.append(USAGE_FILTER[budget.scope])
            params.append(budget.subject)
        start = period_start(budget.period, now)
        if start is not None:
            conditions.append('created_at >= %s')
            params.append(AiBudgetSpend.created_at.db_value(start))
        where = (' WHERE ' + ' AND '.join(conditions)) if conditions else ''
        total = self.store.execute(statement(USAGE_SUM + where), params).fetchone()[0]
        # SQLite sums DECIMAL columns as floats: str() and 6 places give back the stored value.
        return to_micros(Decimal(str(total)).quantize(Decimal('0.000001')))
