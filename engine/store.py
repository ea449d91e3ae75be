"""The store: peewee models for every table of schema.sql, and the database built from a URL.

Models are bound to ``database`` (a proxy) so one process can point them at SQLite or MySQL once
configuration is known. Every timestamp the engine writes comes from the database clock through
``Store.now()`` / ``Store.now_plus_ms()`` (DESIGN decision 2), so lock expiry never depends on the
clocks of the hosts running web or worker processes.
"""
import datetime
import json
import os
import threading
import time
import uuid
from urllib.parse import unquote, urlsplit

import peewee
from peewee import (BigAutoField, CharField, DateTimeField, DecimalField, IntegerField, Model,
                    TextField)
from playhouse.pool import PooledMySQLDatabase

from .errors import ConfigError, StoreUnavailableError

database = peewee.DatabaseProxy()

# Normalised by peewee from both drivers; the rest of the engine uses these names only.
IntegrityError = peewee.IntegrityError
OperationalError = peewee.OperationalError
DoesNotExist = peewee.DoesNotExist


def new_id():
    """A time-ordered UUID (48-bit milliseconds, then 80 random bits), so ids sort by creation
    and B-tree inserts stay at the right edge."""
    millis = int(time.time() * 1000) & ((1 << 48) - 1)
    raw = (millis << 80) | int.from_bytes(os.urandom(10), 'big')
    raw = (raw & ~(0xF << 76)) | (0x7 << 76)          # version 7
    raw = (raw & ~(0x3 << 62)) | (0x2 << 62)          # RFC 4122 variant
    return str(uuid.UUID(int=raw))


# ---------------------------------------------------------------- field types
class Timestamp(DateTimeField):
    """DATETIME(6), UTC, written from the database clock."""
    field_type = 'DATETIME(6)'

    def db_value(self, value):
        # SQLite keeps times as text at the clock's millisecond precision; a Python datetime
        # compared with them must be written the same way, or '….123' < '….123000'.
        if isinstance(value, datetime.datetime) and isinstance(database.obj, peewee.SqliteDatabase):
            return value.strftime('%Y-%m-%d %H:%M:%S.') + '%03d' % (value.microsecond // 1000)
        return super().db_value(value)


class JSONText(TextField):
    """JSON kept as LONGTEXT (MariaDB's JSON is LONGTEXT anyway; SQLite has no JSON type)."""
    field_type = 'LONGTEXT'

    def db_value(self, value):
        if value is None:
            return None
        return json.dumps(value, separators=(',', ':'), ensure_ascii=False)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class BaseModel(Model):
    class Meta:
        database = database
        legacy_table_names = False


# ---------------------------------------------------------------- tables (DESIGN.md "Store")
class AiJob(BaseModel):
    id = CharField(max_length=36, primary_key=True)
    lifecycle_status = CharField(max_length=16)
    queue_name = CharField(max_length=32)
    priority = IntegerField()
    progress = IntegerField(default=0)
    user_id = CharField(max_length=64)
    job_type = CharField(max_length=64)
    target_type = CharField(max_length=64)
    target_id = CharField(max_length=128)
    idempotency_key = CharField(max_length=255, null=True)
    request_fingerprint = CharField(max_length=64)
    credential_mode = CharField(max_length=32)
    credential_id = CharField(max_length=36, null=True)
    prompt_version = CharField(max_length=32, null=True)
    output_schema_version = CharField(max_length=32, null=True)
    locked_by = CharField(max_length=64, null=True)
    locked_at = Timestamp(null=True)
    lock_until = Timestamp(null=True)
    attempt_no = IntegerField(default=0)
    retry_count = IntegerField(default=0)
    max_retry_count = IntegerField(default=0)
    cancel_requested_at = Timestamp(null=True)
    started_at = Timestamp(null=True)
    finished_at = Timestamp(null=True)
    error_code = CharField(max_length=64, null=True)
    public_error_message = CharField(max_length=512, null=True)
    internal_error_message = TextField(null=True)
    output_hash = CharField(max_length=64, null=True)
    retry_of_job_id = CharField(max_length=36, null=True)
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_job'
        indexes = (
            (('user_id', 'job_type', 'idempotency_key'), True),
            (('lifecycle_status', 'lock_until'), False),      # reaper
            (('lifecycle_status', 'created_at'), False),      # reconciler, admin filter
            (('user_id', 'lifecycle_status'), False),         # per-user active-job limit
            (('user_id', 'created_at'), False),               # daily quota, user listing
            (('job_type', 'created_at'), False),              # admin filter
            (('queue_name', 'created_at'), False),            # admin filter
            (('created_at',), False),                         # admin range
            (('retry_of_job_id',), False),
        )


class AiJobSnapshot(BaseModel):
    """What the job runs on: the validated input and overrides, frozen at creation (ADR §8.4)."""
    id = BigAutoField()
    job_id = CharField(max_length=36, unique=True)
    content = JSONText()
    redaction_version = IntegerField(default=1)
    expires_at = Timestamp(null=True)
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_job_snapshot'
        indexes = ((('expires_at',), False),)


class AiArtifact(BaseModel):
    """A JSON result written by the built-in projector; business projectors may use own tables."""
    id = CharField(max_length=36, primary_key=True)
    job_id = CharField(max_length=36)
    artifact_type = CharField(max_length=64)
    content = JSONText()
    content_hash = CharField(max_length=64)
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_artifact'
        indexes = ((('job_id',), False),)


class AiJobArtifact(BaseModel):
    """Links a job to what its projector wrote (ADR §6.3: unique per job, type and artifact)."""
    id = BigAutoField()
    job_id = CharField(max_length=36)
    artifact_type = CharField(max_length=64)
    artifact_id = CharField(max_length=64)
    ordinal = IntegerField(default=0)
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_job_artifact'
        indexes = ((('job_id', 'artifact_type', 'artifact_id'), True),)


class OutboxEvent(BaseModel):
    id = BigAutoField()
    event_type = CharField(max_length=64)
    aggregate_type = CharField(max_length=64)
    aggregate_id = CharField(max_length=64)
    dedupe_key = CharField(max_length=255, unique=True)
    payload = JSONText()
    status = CharField(max_length=16)
    attempt_count = IntegerField(default=0)
    available_at = Timestamp()
    locked_by = CharField(max_length=64, null=True)
    locked_at = Timestamp(null=True)
    last_error = CharField(max_length=512, null=True)
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'outbox_event'
        indexes = (
            (('status', 'available_at'), False),    # find_dispatchable
            (('status', 'locked_at'), False),       # release_expired_locks
            (('aggregate_id',), False),
        )


class AiUsageLog(BaseModel):
    id = BigAutoField()
    job_id = CharField(max_length=36)
    user_id = CharField(max_length=64)
    job_type = CharField(max_length=64)
    attempt_no = IntegerField()
    credential_mode = CharField(max_length=32)
    provider = CharField(max_length=64)
    model = CharField(max_length=128)
    prompt_tokens = IntegerField(default=0)
    completion_tokens = IntegerField(default=0)
    cost = DecimalField(max_digits=14, decimal_places=6, default=0)
    latency_ms = IntegerField(default=0)
    error_code = CharField(max_length=64, null=True)
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_usage_log'
        indexes = (
            (('job_id',), False),
            (('user_id', 'created_at'), False),
            (('job_type', 'created_at'), False),
            (('created_at',), False),
        )


class UserModelCredential(BaseModel):
    """A user's provider key, AES-256-GCM encrypted; only ``masked_key`` is ever shown."""
    id = CharField(max_length=36, primary_key=True)
    user_id = CharField(max_length=64)
    provider = CharField(max_length=64)
    encrypted_key = TextField()
    masked_key = CharField(max_length=32)
    created_at = Timestamp()

    class Meta:
        table_name = 'user_model_credential'
        indexes = ((('user_id',), False),)


class ApiToken(BaseModel):
    """A bearer token, stored as its SHA-256 only."""
    id = BigAutoField()
    token_hash = CharField(max_length=64, unique=True)
    user_id = CharField(max_length=64)
    role = CharField(max_length=16)
    created_at = Timestamp()
    revoked_at = Timestamp(null=True)

    class Meta:
        table_name = 'api_token'
        indexes = ((('user_id',), False),)


MODELS = (AiJob, AiJobSnapshot, AiArtifact, AiJobArtifact, OutboxEvent, AiUsageLog,
          UserModelCredential, ApiToken)


# ---------------------------------------------------------------- databases
class _CommitCounter:
    def __init__(self):
        self._lock = threading.Lock()
        self.value = 0

    def add(self):
        with self._lock:
            self.value += 1


COMMITS = _CommitCounter()


class _CountingMixin:
    """Counts commits (for the benchmark): explicit COMMITs plus each write in autocommit mode."""

    def commit(self):
        COMMITS.add()
        return super().commit()

    def execute_sql(self, sql, params=None):
        if sql[:6] in ('INSERT', 'UPDATE', 'DELETE') and not self.in_transaction():
            COMMITS.add()
        return super().execute_sql(sql, params)


class _MySQL(_CountingMixin, PooledMySQLDatabase):
    pass


class _SQLite(_CountingMixin, peewee.SqliteDatabase):
    pass


def open_database(url, pool_size=32):
    """A peewee database for ``sqlite:///PATH`` or ``mysql://USER:PASS@HOST:PORT/DB``."""
    parts = urlsplit(url)
    if parts.scheme == 'sqlite':
        path = url[len('sqlite:///'):]
        # IMMEDIATE: a write transaction takes the write lock at BEGIN, so concurrent writers wait
        # on busy_timeout instead of failing on a lock upgrade.
        return _SQLite(path, lock_type='IMMEDIATE', check_same_thread=False, pragmas={
            'journal_mode': 'wal', 'busy_timeout': 30000, 'synchronous': 'normal',
            'foreign_keys': 0})
    if parts.scheme in ('mysql', 'mariadb'):
        return _MySQL(
            parts.path.strip('/'), host=parts.hostname or '127.0.0.1', port=parts.port or 3306,
            user=unquote(parts.username or 'root'), password=unquote(parts.password or ''),
            charset='utf8mb4', max_connections=pool_size, stale_timeout=300, timeout=30,
            init_command='SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED')
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
        self.dialect = 'sqlite' if isinstance(self.db, peewee.SqliteDatabase) else 'mysql'

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

    def is_transient(self, exc):
        """A deadlock, lock wait timeout or busy database: the whole transaction may be retried."""
        if not isinstance(exc, OperationalError):
            return False
        code = exc.orig.args[0] if getattr(exc, 'orig', None) is not None and exc.orig.args else None
        return code in (1205, 1213) or 'database is locked' in str(exc)

    def run_in_transaction(self, work, attempts=5):
        """Run ``work(tx)`` in a transaction, again on a deadlock (up to ``attempts`` times)."""
        for attempt in range(1, attempts + 1):
            try:
                with self.atomic() as tx:
                    return work(tx)
            except OperationalError as exc:
                if attempt == attempts or not self.is_transient(exc):
                    raise
                time.sleep(0.005 * attempt)

    # -- the database clock (DESIGN decision 2)
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
    def create_schema(self, schema_sql_path=None):
        """Create every table if missing. MySQL applies schema.sql (the deployed DDL); SQLite
        creates from the models. Safe to run twice."""
        with self.connection():
            if self.dialect == 'mysql':
                for statement in split_sql(_read(schema_sql_path or default_schema_path())):
                    self.db.execute_sql(statement)
            else:
                self.db.create_tables(MODELS, safe=True)

    def ping(self):
        """Raise StoreUnavailableError unless a trivial query answers."""
        try:
            with self.connection():
                self.db.execute_sql('SELECT 1').fetchone()
        except (OperationalError, peewee.InterfaceError) as exc:
            raise StoreUnavailableError('database unreachable: %s' % exc.__class__.__name__) from None

    def close(self):
        if hasattr(self.db, 'close_all'):
            self.db.close_all()
        elif not self.db.is_closed():
            self.db.close()


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
        return peewee.SQL("date('now')")      # 'YYYY-MM-DD' sorts before any time that day
    return peewee.SQL('UTC_DATE()')


_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def _now_sql(db):
    return _SQLITE_NOW if isinstance(db, peewee.SqliteDatabase) else 'UTC_TIMESTAMP(6)'


def default_schema_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'schema.sql')


def _read(path):
    with open(path, encoding='utf-8') as handle:
        return handle.read()


def split_sql(text):
    """Statements of a DDL file: ``;``-terminated, ``-- `` comments (whole or trailing) dropped.
    The DDL has no string literals, so a plain split is enough."""
    lines = [line.split('-- ', 1)[0].rstrip() for line in text.splitlines()]
    return [stmt.strip() for stmt in '\n'.join(lines).split(';') if stmt.strip()]

