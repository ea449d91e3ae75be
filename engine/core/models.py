"""The tables of schema.sql as peewee models, the ids rows get, and the canonical hash of their
JSON contents.

Models are bound to ``database`` (a proxy) so one process can point them at SQLite or MySQL once
configuration is known (see store.py).
"""

import datetime
import hashlib
import json
import os
import threading
import time
import uuid

import peewee
from peewee import (
    BigAutoField,
    BooleanField,
    CharField,
    DateField,
    DateTimeField,
    DecimalField,
    IntegerField,
    Model,
    TextField,
)

database = peewee.DatabaseProxy()


_last_id = [0, 0]  # (milliseconds, 74-bit tail) of this process's latest id
_id_lock = threading.Lock()
_TAIL_BITS = 74  # a UUIDv7's 80 bits after the time, less version (4) and variant (2)


def new_id():
    """A time-ordered UUID v7 (48-bit milliseconds, then 74 bits), so ids sort by creation and
    B-tree inserts stay at the right edge. Within one millisecond a process's ids keep increasing
    (the previous tail plus a random step), so jobs created that close still list in order."""
    with _id_lock:
        millis = max(int(time.time() * 1000) & ((1 << 48) - 1), _last_id[0])
        if millis == _last_id[0]:
            tail = _last_id[1] + int.from_bytes(os.urandom(4), 'big') + 1
        else:
            tail = int.from_bytes(os.urandom(9), 'big') >> (72 - _TAIL_BITS + 2)
        if tail >> _TAIL_BITS:  # this millisecond's space is used up: take the next one
            millis, tail = millis + 1, 0
        _last_id[:] = [millis, tail]
    raw = (
        (millis << 80)
        | (0x7 << 76)  # version 7
        | ((tail >> 62) << 64)
        | (0x2 << 62)  # RFC 4122 variant
        | (tail & ((1 << 62) - 1))
    )
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


# ----------------------------------------------------------- tables (docs/architecture.md, "Store")
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
    idempotency_key = CharField(max_length=255, null=True)  # exact: store.EXACT_COLUMNS
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
    # Locks that ended in a deferral (lifecycle.defer): they do not count against the queue's
    # attempts, so the takeover bound reads ``attempt_no - defer_count``.
    # A default in the table too: the hot path's INSERT (lifecycle.CREATE_COLUMNS) leaves it out.
    defer_count = IntegerField(default=0, constraints=[peewee.SQL('DEFAULT 0')])

    class Meta:
        table_name = 'ai_job'
        indexes = (
            (('user_id', 'job_type', 'idempotency_key'), True),
            (('lifecycle_status', 'lock_until'), False),  # reaper
            (('lifecycle_status', 'created_at'), False),  # reconciler, admin filter
            (('user_id', 'created_at'), False),  # daily quota, user listing
            (('job_type', 'created_at'), False),  # admin filter
            (('job_type', 'queue_name', 'created_at'), False),  # admin filter: both, rarely met
            (('queue_name', 'created_at'), False),  # admin filter
            (('created_at',), False),  # admin range
            (('retry_of_job_id',), False),
            (('finished_at',), False),  # the operators' throughput, bulk retry since T
            # the busiest users (busiest_users.py): waiting, running, recent waits per user
            (('lifecycle_status', 'user_id', 'started_at', 'created_at'), False),
        )


class AiJobSnapshot(BaseModel):
    """What the job runs on: the validated input and overrides, frozen at creation
    (contracts §8.4)."""

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
    """Links a job to what its projector wrote (contracts §6.3: unique per job, type and
    artifact)."""

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
    dedupe_key = CharField(max_length=255, unique=True)  # exact: store.EXACT_COLUMNS
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
            (('status', 'available_at'), False),  # claim_batch
            (('status', 'locked_at'), False),  # release_expired_locks
            (('aggregate_id',), False),
        )


class AiUsageLog(BaseModel):
    id = BigAutoField()
    job_id = CharField(max_length=36)
    user_id = CharField(max_length=64)
    job_type = CharField(max_length=64)
    attempt_no = IntegerField()  # the job's attempt (lock) the call belonged to
    call_no = IntegerField(default=1)  # which provider call of the job it was: 1, 2, …
    credential_mode = CharField(max_length=32)
    provider = CharField(max_length=64)
    model = CharField(max_length=128)
    prompt_tokens = IntegerField(default=0)
    completion_tokens = IntegerField(default=0)
    cost = DecimalField(max_digits=14, decimal_places=6, default=0)
    latency_ms = IntegerField(default=0)
    error_code = CharField(max_length=64, null=True)
    cached = BooleanField(default=False)  # answered by the response cache: no provider call
    batch_id = CharField(max_length=36, null=True)  # answered in this ai_provider_batch (issue 22)
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
    """A bearer token, stored as its SHA-256 only. ``user_id`` is the user the token acts as,
    or for role ``service`` the service's name; ``token_hint`` is the token's first characters,
    enough to tell tokens apart in a list, far too few to use."""

    id = BigAutoField()
    token_hash = CharField(max_length=64, unique=True)
    user_id = CharField(max_length=64)
    role = CharField(max_length=16)
    created_at = Timestamp()
    revoked_at = Timestamp(null=True)
    last_used_at = Timestamp(null=True)  # written at most once a minute per token
    token_hint = CharField(max_length=16, null=True)

    class Meta:
        table_name = 'api_token'
        indexes = ((('user_id',), False),)


class AiJobEvent(BaseModel):
    """One lifecycle change of a job (architecture decision 14), written in the transaction that
    made it. ``id`` increases across the table: the history is read in id order, and a live
    stream resumes after the last id it sent."""

    id = BigAutoField()
    job_id = CharField(max_length=36)
    kind = CharField(max_length=32)
    attempt_no = IntegerField()
    detail = JSONText()
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_job_event'
        indexes = (
            (('job_id', 'id'), False),
            (('created_at',), False),  # the purge of old history
        )


class AppSecret(BaseModel):
    """A random secret the service made for itself, kept so every process and restart agrees
    on it: the key of the jobs' publicAccessTokens when no credential master key is set."""

    name = CharField(max_length=64, primary_key=True)
    value = CharField(max_length=128)
    created_at = Timestamp()

    class Meta:
        table_name = 'app_secret'


class LeaderLease(BaseModel):
    """Who holds a named lease (``housekeeping``: the reaper, reconciler, outbox polling and
    purge run on its holder) and until when, by the database clock (architecture decision 12).
    Taken and renewed by compare-and-set (engine/core/leases.py)."""

    name = CharField(max_length=64, primary_key=True)
    holder = CharField(max_length=128)  # the holding process's instance id
    acquired_at = Timestamp()  # when this holder took it (kept across renewals)
    expires_at = Timestamp()

    class Meta:
        table_name = 'leader_lease'


class AiUserAdmission(BaseModel):
    """A user's admission counters (engine/core/admission.py): unfinished jobs, and jobs created
    on ``day`` (the database's UTC day). Changed in the transactions that change a job's status:
    +1 each by its create, ``active`` −1 by its terminal write, so they are exact through crashes
    and the per-user limits read one row instead of counting jobs."""

    user_id = CharField(max_length=64, primary_key=True)
    active = IntegerField()  # queued or running
    day = DateField()  # the UTC day of created_on_day
    created_on_day = IntegerField()
    last_job_id = CharField(max_length=36)  # the last job admitted: tells a create it was
    # The limits the last create was held to (0: none); on MariaDB a CHECK constraint holds
    # the counts within them (schema.sql), so a refusal is the upsert's own error.
    active_limit = IntegerField(default=0, constraints=[peewee.SQL('DEFAULT 0')])
    daily_limit = IntegerField(default=0, constraints=[peewee.SQL('DEFAULT 0')])

    class Meta:
        table_name = 'ai_user_admission'


MODELS = (
    AiJob,
    AiJobSnapshot,
    AiArtifact,
    AiJobArtifact,
    OutboxEvent,
    AiUsageLog,
    UserModelCredential,
    ApiToken,
    AiJobEvent,
    LeaderLease,
    AiUserAdmission,
    AppSecret,
)


# ---------------------------------------------------------------- canonical JSON
def canonical_json(value):
    return json.dumps(
        value, sort_keys=True, separators=(',', ':'), ensure_ascii=False, allow_nan=False
    )


def canonical_hash(value):
    return hashlib.sha256(canonical_json(value).encode('utf-8')).hexdigest()
