"""The store: the database built from a URL, transactions, the database clock and the schema.

Every timestamp the engine writes comes from the database clock through ``db_now()``
(architecture decision 2), so lock expiry never depends on the clocks of the hosts
running web or worker processes.
"""

import datetime
import logging
import os
import threading
import time
from urllib.parse import unquote, urlsplit

import peewee
from playhouse.pool import MaxConnectionsExceeded, PooledMySQLDatabase
from pymysql.constants import CLIENT, SERVER_STATUS

from . import admission, sql
from .config import database_features
from .errors import ConfigError, StoreUnavailableError
from .logs import log_event
from .models import MODELS, database

# Columns added to a table after it first shipped: (table, column, DDL valid on both dialects).
ADDED_COLUMNS = (
    ('ai_usage_log', 'call_no', 'INTEGER NOT NULL DEFAULT 1'),
    ('ai_usage_log', 'cached', 'BOOLEAN NOT NULL DEFAULT 0'),  # the response cache (issue 21)
    ('ai_job', 'defer_count', 'INTEGER NOT NULL DEFAULT 0'),  # deferrals (lifecycle.defer)
    ('ai_usage_log', 'batch_id', 'VARCHAR(36) NULL'),  # provider batches (issue 22)
    # the limits a create was held to, for the CHECK below (admission.py)
    ('ai_user_admission', 'active_limit', 'INTEGER NOT NULL DEFAULT 0'),
    ('ai_user_admission', 'daily_limit', 'INTEGER NOT NULL DEFAULT 0'),
    # service keys and the admin tokens API (issue 33)
    ('api_token', 'last_used_at', 'DATETIME(6) NULL'),
    ('api_token', 'token_hint', 'VARCHAR(16) NULL'),
)
# CHECK constraints that came later, MySQL/MariaDB only (SQLite cannot add one to a table):
# (table, constraint name, condition), as in schema.sql.
ADDED_CHECKS = (('ai_user_admission', admission.LIMITS_CHECK, admission.LIMITS_CONDITION),)
# MariaDB's error for a failed CHECK constraint (ER_CONSTRAINT_FAILED).
CHECK_FAILED = 4025
# SIGNAL's error: a statement of ours refusing its transaction (lifecycle's guard of a terminal
# UPDATE), the server answering.
SIGNALLED = 1644
# Columns whose values are compared as exact strings, MySQL/MariaDB only: (table, column, type,
# nullability). A client's idempotency key, and the enqueue dedupe key built from it, is the
# same key only byte for byte (as the IETF draft and Stripe treat keys), where the server's
# default collation would make 'abc', 'ABC' and 'abc ' one key. SQLite compares them exactly
# already (its default collation, BINARY). The hex digests (token, session, cache keys) and the
# ids the engine makes are lowercase by construction, so their collation changes nothing.
EXACT_COLUMNS = (
    ('ai_job', 'idempotency_key', 'VARCHAR(255)', 'NULL'),
    ('outbox_event', 'dedupe_key', 'VARCHAR(255)', 'NOT NULL'),
)
# The exact collations, best first: binary and NO PAD (trailing spaces count), MariaDB's then
# MySQL 8's; utf8mb4_bin (schema.sql's, on every server) still tells letter case apart.
EXACT_COLLATIONS = ('utf8mb4_nopad_bin', 'utf8mb4_0900_bin', 'utf8mb4_bin')
# Indexes that came later, likewise: (table, index name, columns).
ADDED_INDEXES = (
    ('ai_job', 'ai_job_finished_at', 'finished_at'),
    ('ai_job_event', 'ai_job_event_created_at', 'created_at'),
    ('ai_job', 'ai_job_job_type_queue_name_created_at', 'job_type, queue_name, created_at'),
    (
        'ai_job',
        'ai_job_lifecycle_status_user_id_started_at_created_at',
        'lifecycle_status, user_id, started_at, created_at',
    ),
)
# Indexes that went: (table, index name). ai_job (user_id, lifecycle_status) served the count
# of a user's unfinished jobs, which the admission counters replaced (admission.py); nothing
# reads it since, and every status write paid for it.
DROPPED_INDEXES = (('ai_job', 'ai_job_user_id_lifecycle_status'),)

# Normalised by peewee from both drivers; the rest of the engine uses these names only.
IntegrityError = peewee.IntegrityError
OperationalError = peewee.OperationalError
DoesNotExist = peewee.DoesNotExist
# Every pooled connection stayed busy for the pool's whole wait (a burst beyond the pool size).
PoolExhausted = MaxConnectionsExceeded


# ---------------------------------------------------------------- databases
class _Counter:
    def __init__(self):
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n=1):
        with self._lock:
            self.value += n


COMMITS = _Counter()
# Every SQL statement this process sends, BEGIN/COMMIT/ROLLBACK included (for the benchmark).
STATEMENTS = _Counter()
# Every time this process waits for the database's answer: several statements sent together
# (sql.send, a BEGIN going with its transaction's first statement) are one round trip.
ROUND_TRIPS = _Counter()


class _CountingMixin:
    """Counts, for the benchmark, commits (explicit COMMITs plus each write in autocommit mode)
    and statements (everything through ``execute_sql``, plus BEGIN, COMMIT and ROLLBACK, which
    peewee sends on its own cursor). Code that runs SQL on the raw driver connection instead
    would have to count its statements too; a connection-pool ping is no statement and is not
    counted."""

    def begin(self, *args, **kwargs):
        STATEMENTS.add(2 if kwargs.get('isolation_level') else 1)
        ROUND_TRIPS.add(2 if kwargs.get('isolation_level') else 1)
        return super().begin(*args, **kwargs)

    def commit(self):
        COMMITS.add()
        STATEMENTS.add()
        ROUND_TRIPS.add()
        return super().commit()

    def rollback(self):
        STATEMENTS.add()
        ROUND_TRIPS.add()
        return super().rollback()

    def count_statements(self, n):
        """``n`` more statements sent in one round trip (sql.send)."""
        STATEMENTS.add(n)

    def execute_sql(self, sql, params=None):
        STATEMENTS.add()
        ROUND_TRIPS.add()
        if sql[:6] in ('INSERT', 'UPDATE', 'DELETE') and not self.in_transaction():
            COMMITS.add()
        return super().execute_sql(sql, params)


class _MySQL(_CountingMixin, PooledMySQLDatabase):
    """peewee's pool without two round trips per checkout: it pings every connection it hands
    out, and rolls back every one handed back (pymysql does not tell it whether a transaction
    is open). Here a connection that came back less than PING_AFTER_S ago goes out unpinged (a
    dead one fails its first statement, and is dropped when it comes back), and one is rolled
    back only when the server said a transaction is still open."""

    PING_AFTER_S = 5.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._returned_at = {}  # conn_key -> monotonic time it came back to the pool

    def _is_closed(self, conn):
        if not conn.open:
            return True
        returned = self._returned_at.get(self.conn_key(conn))
        if returned is not None and time.monotonic() - returned < self.PING_AFTER_S:
            return False
        return super()._is_closed(conn)

    # BEGIN goes out with the transaction's first statement, in the same round trip (a
    # multi-statement query), and a transaction that sent nothing ends without a word. A
    # connection whose BEGIN waits is marked with ``aijob_begin``.
    def begin(self, isolation_level=None):
        if isolation_level:
            return super().begin(isolation_level=isolation_level)
        self.connection().aijob_begin = True
        return None

    def execute_sql(self, sql, params=None):
        conn = self.connection()
        if getattr(conn, 'aijob_committed', False):
            # autocommit would write it outside the transaction it was meant for
            raise RuntimeError('the transaction committed with its last writes: nothing follows')
        if not getattr(conn, 'aijob_begin', False):
            return super().execute_sql(sql, params)
        conn.aijob_begin = False
        STATEMENTS.add()  # the BEGIN
        cursor = super().execute_sql('BEGIN;\n' + sql, params)
        with peewee.__exception_wrapper__:
            cursor.nextset()  # from BEGIN's answer to the statement's
        return cursor

    # A transaction's COMMIT may go in the round trip of its last writes (sql.send with
    # ``commit``): the connection is marked with ``aijob_committed`` until the transaction ends.
    def committed_with_writes(self):
        """sql.send's COMMIT ran: the transaction's own end sends nothing."""
        COMMITS.add()
        self.connection().aijob_committed = True

    def commit(self):
        if self._ending('aijob_begin') or self._ending('aijob_committed'):
            return None
        return super().commit()

    def rollback(self):
        if self._ending('aijob_begin'):
            return None
        if self._ending('aijob_committed'):  # a failure after the COMMIT: too late to undo
            log_event('transaction.rollback_after_commit', logging.WARNING)
            return None
        return super().rollback()

    def _ending(self, mark):
        """Is the transaction now ending marked ``mark`` (``aijob_begin``: it sent nothing,
        its BEGIN still waits; ``aijob_committed``: its COMMIT went with its last writes)?
        The mark goes with it."""
        conn = None if self.is_closed() else self.connection()
        if getattr(conn, mark, False):
            setattr(conn, mark, False)
            return True
        return False

    def _can_reuse(self, conn):
        if not conn.open:
            return False
        conn.aijob_begin = conn.aijob_committed = False
        if conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            try:
                conn.rollback()
            except Exception:
                return False
        self._returned_at[self.conn_key(conn)] = time.monotonic()
        return True

    def _close_raw(self, conn):
        self._returned_at.pop(self.conn_key(conn), None)
        super()._close_raw(conn)


class _SQLite(_CountingMixin, peewee.SqliteDatabase):
    pass


LOOPBACK_HOSTS = ('127.0.0.1', 'localhost', '::1')


def open_database(url, pool_size=32):
    """A peewee database for ``sqlite:///PATH`` or ``mysql://USER:PASS@HOST:PORT/DB`` (its
    ``?features=`` is the Store's: config.database_features)."""
    parts = urlsplit(url)
    if parts.scheme == 'sqlite':
        path = url[len('sqlite:///') :]
        # IMMEDIATE: a write transaction takes the write lock at BEGIN, so concurrent writers wait
        # on busy_timeout instead of failing on a lock upgrade.
        return _SQLite(
            path,
            lock_type='IMMEDIATE',
            check_same_thread=False,
            pragmas={
                'journal_mode': 'wal',
                'busy_timeout': 30000,
                'synchronous': 'normal',
                'foreign_keys': 0,
            },
        )
    if parts.scheme in ('mysql', 'mariadb'):
        host = parts.hostname or '127.0.0.1'
        extra = {}
        if host in LOOPBACK_HOSTS:
            # PyMySQL's default (TLS if the server offers it) builds a new SSL context for every
            # connection, ~35 ms of CPU each: a burst that grows the pool paid it 32 times over,
            # one after another under peewee's connect lock. TLS to this host adds nothing.
            extra['ssl_disabled'] = True
        return _MySQL(
            parts.path.strip('/'),
            host=host,
            port=parts.port or 3306,
            user=unquote(parts.username or 'root'),
            password=unquote(parts.password or ''),
            charset='utf8mb4',
            max_connections=pool_size,
            stale_timeout=300,
            timeout=30,
            init_command='SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED',
            # The writes that end a transaction go out in one round trip (sql.send). Every
            # statement's values are escaped by the driver, as for a single statement.
            client_flag=CLIENT.MULTI_STATEMENTS,
            **extra,
        )
    raise ConfigError('unsupported database URL scheme %r' % parts.scheme)


class Store:
    """The bound database plus the few dialect differences the engine needs."""

    def __init__(self, url, pool_size=32):
        # Models are bound to one proxy, so stores of one process on the same URL share one
        # database object (and its pool); a store for another URL re-points the proxy.
        if database.obj is not None and getattr(database.obj, 'aijob_url', None) == url:
            self.db = database.obj
        else:
            self.db = open_database(url, pool_size)
            self.db.aijob_url = url
            database.initialize(self.db)
        self.dialect = sql.dialect_of(self.db)
        # 'mysql' (the URL's ?features=mysql): MySQL's feature set, whatever the server says
        self.features = _features(url) if self.dialect == 'mysql' else None
        self._insert_returns = None
        self._checks = {}  # (table, constraint) -> enforces_check's answer

    # -- transactions
    def atomic(self):
        return self.db.atomic()

    def connection(self):
        """Context for one unit of work in this thread (returns the connection to the pool)."""
        return self.db.connection_context()

    def in_transaction(self):
        return self.db.in_transaction()

    def commit_count(self):
        """Commits made by this process so far (see ``_CountingMixin``)."""
        return COMMITS.value

    def statement_count(self):
        """SQL statements this process has sent so far, BEGIN/COMMIT/ROLLBACK included."""
        return STATEMENTS.value

    def round_trip_count(self):
        """Times this process has waited for the database's answer so far."""
        return ROUND_TRIPS.value

    # -- plain SQL (sql.py)
    def execute(self, statement, params=()):
        """Send a ``sql.Statement`` on this thread's connection; returns the driver cursor."""
        return sql.execute(statement, params)

    def insert_returns(self):
        """Can an INSERT return what it wrote (``INSERT … RETURNING``)? SQLite and MariaDB can;
        MySQL cannot, and its callers read the row back instead. This answer is also what tells
        MariaDB from MySQL for ``enforces_check`` and ``guards_row_counts``, so a store whose URL
        forces MySQL's feature set (``?features=mysql``) takes MySQL's branch in all three."""
        if self._insert_returns is None:
            if self.dialect == 'sqlite':
                self._insert_returns = True
            elif self.features == 'mysql':
                self._insert_returns = False
            else:
                version = self.db.execute_sql('SELECT VERSION()').fetchone()[0]
                self._insert_returns = 'mariadb' in str(version).lower()
        return self._insert_returns

    def enforces_check(self, table, name):
        """Does the database enforce CHECK constraint ``name`` of ``table``: MariaDB, the
        constraint in place (``initdb`` adds it) and its checks on? MySQL is not asked (before
        8.0.16 it ignores CHECK); its callers and SQLite's do without. Asked once per store."""
        key = (table, name)
        if key not in self._checks:
            self._checks[key] = (
                self.dialect == 'mysql'
                and self.insert_returns()
                and self.db.execute_sql(_CHECK_LISTED, (table, name)).fetchone() is not None
                # read on its own: MariaDB answers 0 in a query of information_schema
                and self.db.execute_sql('SELECT @@check_constraint_checks').fetchone()[0] == 1
            )
        return self._checks[key]

    def guards_row_counts(self):
        """Can one statement refuse its transaction when the UPDATE just before it changed too
        few rows (an anonymous block that SIGNALs on ``ROW_COUNT()``)? MariaDB can; MySQL runs
        no block outside a stored program, and SQLite, in process, needs none. Where it can, a
        transaction whose refusal was a row count read back may send its COMMIT with its rows."""
        return self.dialect == 'mysql' and self.insert_returns()

    def is_check_failure(self, exc, name):
        """Did ``exc`` come from CHECK constraint ``name`` refusing a row?"""
        return _code(exc) == CHECK_FAILED and '`%s`' % name in str(exc)

    def ms_param(self, ms):
        """The parameter of a statement's ``{now_plus}``: the clock plus ``ms`` milliseconds."""
        if self.dialect == 'sqlite':
            return '%+.3f seconds' % (ms / 1000.0)
        return int(ms) * 1000

    def is_unreachable(self, exc):
        """Did ``exc`` come from a store that cannot be reached right now (server down, network
        cut, connection dropped), so the same work may succeed later?"""
        if _code(exc) in (CHECK_FAILED, SIGNALLED):  # a row refused, the server answering
            return False
        return isinstance(exc, (OperationalError, peewee.InterfaceError))

    def is_transient(self, exc):
        """A deadlock, lock wait timeout or busy database: the whole transaction may be retried."""
        if not isinstance(exc, OperationalError):
            return False
        return _code(exc) in (1205, 1213) or 'database is locked' in str(exc)

    def run_in_transaction(self, work, attempts=5):
        """Run ``work(tx)`` in a transaction, again on a deadlock (up to ``attempts`` times)."""

        def transaction():
            with self.atomic() as tx:
                return work(tx)

        return self._again_if_transient(transaction, attempts)

    def execute_alone(self, statement, params=(), attempts=5):
        """``execute`` of one statement outside any transaction (autocommit), again when it is
        a deadlock's victim, which rolled back that statement alone. Returns the cursor."""
        assert not self.in_transaction(), 'in a transaction, retry the transaction instead'
        return self._again_if_transient(lambda: self.execute(statement, params), attempts)

    def _again_if_transient(self, call, attempts):
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except OperationalError as exc:
                if attempt == attempts or not self.is_transient(exc):
                    raise
                time.sleep(0.005 * attempt)

    # -- the database clock (architecture decision 2)
    def now(self):
        return db_now()

    def now_plus_ms(self, ms):
        return db_now(ms)

    def clock(self):
        """The database clock as a naive UTC datetime."""
        value = self.db.execute_sql('SELECT ' + _now_sql(self.db)).fetchone()[0]
        if isinstance(value, str):
            value = datetime.datetime.fromisoformat(value)
        return value

    # -- schema
    def create_schema(self, extra_models=(), schema_sql_path=None, tables=()):
        """Create every table if missing. MySQL applies schema.sql (the deployed DDL), then each
        feature's own DDL (``tables``: core.extension.Tables); SQLite creates both from the
        models. ``extra_models`` (job-type plugins' own tables) are created from their models on
        both. Safe to run twice."""
        with self.connection():
            if self.dialect == 'mysql':
                paths = [schema_sql_path or default_schema_path()]
                paths += [feature.schema_sql for feature in tables]
                for path in paths:
                    for statement in split_sql(_read(path)):
                        self.db.execute_sql(statement)
            else:
                self.db.create_tables(MODELS, safe=True)
                for feature in tables:
                    self.db.create_tables(list(feature.models), safe=True)
            self._add_missing_columns()
            admission.backfill(self)
            if extra_models:
                self.db.create_tables(list(extra_models), safe=True)

    def _add_missing_columns(self):
        """CREATE TABLE IF NOT EXISTS leaves a table from an older release as it was: add the
        columns and indexes that came later and drop the indexes that went, so ``initdb``
        upgrades a deployment in place."""
        for table, column, ddl in ADDED_COLUMNS:
            if column not in {c.name for c in self.db.get_columns(table)}:
                self.db.execute_sql('ALTER TABLE %s ADD COLUMN %s %s' % (table, column, ddl))
        for table, name, columns in ADDED_INDEXES:
            if name not in {index.name for index in self.db.get_indexes(table)}:
                self.db.execute_sql('CREATE INDEX %s ON %s (%s)' % (name, table, columns))
        for table, name in DROPPED_INDEXES:
            if name in {index.name for index in self.db.get_indexes(table)}:
                on = ' ON %s' % table if self.dialect == 'mysql' else ''
                self.db.execute_sql('DROP INDEX %s%s' % (name, on))
        if self.dialect == 'mysql':
            for table, name, condition in ADDED_CHECKS:
                if not self.db.execute_sql(_CHECK_LISTED, (table, name)).fetchone():
                    self.db.execute_sql(
                        'ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s)' % (table, name, condition)
                    )
            self._make_keys_exact()

    def _make_keys_exact(self):
        """Give EXACT_COLUMNS the server's best exact collation, a table from an older release
        (the server's case-insensitive default) included. Only a column whose collation differs
        is altered (the ALTER copies its table once); safe to run twice."""
        collation = self.exact_collation()
        for table, column, kind, nullability in EXACT_COLUMNS:
            if self.column_collation(table, column) != collation:
                self.db.execute_sql(
                    'ALTER TABLE %s MODIFY %s %s CHARACTER SET utf8mb4 COLLATE %s %s'
                    % (table, column, kind, collation, nullability)
                )

    def exact_collation(self):
        """The first of EXACT_COLLATIONS this MySQL/MariaDB server has."""
        listed = self.db.execute_sql(
            'SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN '
            '(%s)' % ', '.join(['%s'] * len(EXACT_COLLATIONS)),
            EXACT_COLLATIONS,
        )
        have = {row[0] for row in listed.fetchall()}
        return next(name for name in EXACT_COLLATIONS if name in have)

    def column_collation(self, table, column):
        """A MySQL/MariaDB column's collation in this database."""
        return self.db.execute_sql(_COLLATION_OF, (table, column)).fetchone()[0]

    def ping(self):
        """Raise StoreUnavailableError unless a trivial query answers."""
        try:
            with self.connection():
                self.db.execute_sql('SELECT 1').fetchone()
        except (OperationalError, peewee.InterfaceError) as exc:
            raise StoreUnavailableError(
                'database unreachable: %s' % exc.__class__.__name__
            ) from None

    def close(self):
        if hasattr(self.db, 'close_all'):
            self.db.close_all()
        elif not self.db.is_closed():
            self.db.close()


_COLLATION_OF = (
    'SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() '
    'AND TABLE_NAME = %s AND COLUMN_NAME = %s'
)
_CHECK_LISTED = (
    'SELECT 1 FROM information_schema.TABLE_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE() '
    "AND TABLE_NAME = %s AND CONSTRAINT_NAME = %s AND CONSTRAINT_TYPE = 'CHECK'"
)


def _features(url):
    try:
        return database_features(url)
    except ValueError as exc:
        raise ConfigError('AIJOB_DATABASE_URL is invalid: %s' % exc) from None


def _code(exc):
    """The MySQL/MariaDB error number behind a peewee error, or None."""
    orig = getattr(exc, 'orig', None)
    return orig.args[0] if orig is not None and orig.args else None


def db_now(ms=0):
    """SQL for the bound database's clock, UTC, plus ``ms`` milliseconds (negative: minus)."""
    if not ms:
        return peewee.SQL(_now_sql(database.obj))
    if not isinstance(database.obj, peewee.SqliteDatabase):
        return peewee.SQL('(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)', (int(ms) * 1000,))
    return peewee.SQL("strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", ('%+.3f seconds' % (ms / 1000.0),))


def db_today():
    """SQL for the start of the database clock's current UTC day."""
    if isinstance(database.obj, peewee.SqliteDatabase):
        return peewee.SQL("date('now')")  # 'YYYY-MM-DD' sorts before any time that day
    return peewee.SQL('UTC_DATE()')


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def _now_sql(db):
    return _SQLITE_NOW if isinstance(db, peewee.SqliteDatabase) else 'UTC_TIMESTAMP(6)'


def default_schema_path():
    return os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'schema.sql'
    )


def _read(path):
    with open(path, encoding='utf-8') as handle:
        return handle.read()


def split_sql(text):
    """Statements of a DDL file: ``;``-terminated, ``-- `` comments (whole or trailing) dropped.
    The DDL has no string literals, so a plain split is enough."""
    lines = [line.split('-- ', 1)[0].rstrip() for line in text.splitlines()]
    return [stmt.strip() for stmt in '\n'.join(lines).split(';') if stmt.strip()]
