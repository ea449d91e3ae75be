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
    BigIntegerField,
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
            (('user_id', 'lifecycle_status'), False),  # per-user active-job limit
            (('user_id', 'created_at'), False),  # daily quota, user listing
            (('job_type', 'created_at'), False),  # admin filter
            (('job_type', 'queue_name', 'created_at'), False),  # admin filter: both, rarely met
            (('queue_name', 'created_at'), False),  # admin filter
            (('created_at',), False),  # admin range
            (('retry_of_job_id',), False),
            (('finished_at',), False),  # the operators' throughput, bulk retry since T
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


class DashboardSession(BaseModel):
    """A signed-in dashboard session, stored as the SHA-256 of its id only (the id lives in the
    operator's HttpOnly cookie). It remembers the admin token it was opened with, so revoking
    that token ends the session too."""

    session_hash = CharField(max_length=64, primary_key=True)
    token_hash = CharField(max_length=64)
    user_id = CharField(max_length=64)
    created_at = Timestamp()
    expires_at = Timestamp()

    class Meta:
        table_name = 'dashboard_session'
        indexes = ((('expires_at',), False),)  # the purge of expired sessions


class AppSecret(BaseModel):
    """A random secret the service made for itself, kept so every process and restart agrees
    on it: the key of the jobs' publicAccessTokens when no credential master key is set."""

    name = CharField(max_length=64, primary_key=True)
    value = CharField(max_length=128)
    created_at = Timestamp()

    class Meta:
        table_name = 'app_secret'


class WebhookEndpoint(BaseModel):
    """Where a user's terminal job events are pushed (architecture decision 15). A row with
    ``job_id`` is the ``webhookUrl`` of that one job. No secret is kept: an endpoint's signing
    secret is derived from the master key and its id (engine/execution/webhook_signing.py)."""

    id = CharField(max_length=36, primary_key=True)
    user_id = CharField(max_length=64)
    url = CharField(max_length=2048)
    events = JSONText(null=True)  # event types to send; null: all
    job_types = JSONText(null=True)  # job types to send; null: all
    job_id = CharField(max_length=36, null=True)
    created_at = Timestamp()
    deleted_at = Timestamp(null=True)

    class Meta:
        table_name = 'webhook_endpoint'
        indexes = (
            (('user_id', 'deleted_at'), False),  # a user's endpoints, the fan-out
            (('job_id',), False),  # a job's own webhookUrl
        )


class WebhookDelivery(BaseModel):
    """One terminal event to one endpoint: claimed by compare-and-set, retried with backoff.
    Its id is the ``webhook-id`` header of every attempt."""

    id = CharField(max_length=36, primary_key=True)
    endpoint_id = CharField(max_length=36)
    event_id = BigIntegerField()
    event_type = CharField(max_length=64)
    job_id = CharField(max_length=36)
    status = CharField(max_length=16)  # pending | sending | delivered | dead
    attempt_count = IntegerField(default=0)
    next_attempt_at = Timestamp()  # due time; while sending, the end of the claim
    locked_by = CharField(max_length=64, null=True)
    last_status_code = IntegerField(null=True)
    last_error = CharField(max_length=512, null=True)
    delivered_at = Timestamp(null=True)
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'webhook_delivery'
        indexes = (
            (('event_id', 'endpoint_id'), True),  # a fan-out repeated after a crash adds nothing
            (('status', 'next_attempt_at'), False),  # the sender's claim
            (('endpoint_id',), False),  # admin filter
            (('job_id',), False),  # admin filter
        )


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


# ---------------------------------------------------------------- budgets (issue 21 item 5)
class AiBudget(BaseModel):
    """A budget in money (engine/gateway/budgets.py): ``amount`` per period for one user, one
    job type or everything, in the units of ai_usage_log.cost."""

    id = CharField(max_length=36, primary_key=True)
    scope = CharField(max_length=16)  # user | jobType | global
    subject = CharField(max_length=64)  # the user id or job type; '' when global
    period = CharField(max_length=8)  # day | month | total
    amount = DecimalField(max_digits=14, decimal_places=6)
    on_exceeded = CharField(max_length=8)  # fail | wait
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_budget'
        indexes = ((('scope', 'subject', 'period'), True),)


class AiBudgetSpend(BaseModel):
    """A budget's spend and open reservations in one period (``period_key``)."""

    id = BigAutoField()
    budget_id = CharField(max_length=36)
    period_key = CharField(max_length=16)
    spent_micros = BigIntegerField()  # millionths of the cost unit: exact on both databases
    reserved_micros = BigIntegerField()
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_budget_spend'
        indexes = ((('budget_id', 'period_key'), True),)


class AiBudgetReservation(BaseModel):
    """One provider call's reserved maximum cost, until its usage row is written; ``job_id`` and
    ``attempt_no`` tie it to the job's lock (the reaper releases it when that lock is gone)."""

    id = BigAutoField()
    job_id = CharField(max_length=36)
    attempt_no = IntegerField()
    call_no = IntegerField()
    amount_micros = BigIntegerField()  # the call's maximum cost, in millionths
    spend_ids = CharField(max_length=255)  # the ai_budget_spend rows it counts in: "1,7,9"
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_budget_reservation'
        indexes = ((('job_id',), False), (('created_at',), False))


class AiResponseCache(BaseModel):
    """The response cache (engine/gateway/cache.py): one row per cache key. A row without
    ``output`` is a claim: job ``owner_job_id`` is calling the provider for that key, and
    identical jobs wait for its answer until ``expires_at`` (the claim's expiry). A row with
    ``output`` is an entry, live until ``expires_at``; the purger deletes expired rows."""

    cache_key = CharField(max_length=64, primary_key=True)  # SHA-256 hex of the request
    job_type = CharField(max_length=64)
    owner_job_id = CharField(max_length=36)  # the job that claimed the key or wrote the entry
    output = JSONText(null=True)  # NULL while claimed
    model = CharField(max_length=128, default='')  # the model that answered
    prompt_tokens = IntegerField(default=0)
    completion_tokens = IntegerField(default=0)
    created_at = Timestamp()
    expires_at = Timestamp()

    class Meta:
        table_name = 'ai_response_cache'
        indexes = ((('expires_at',), False),)  # the purge of expired rows


# ---------------------------------------------------------------- provider batches (issue 22)
class AiProviderBatch(BaseModel):
    """One batch sent to a provider's batch API (engine/gateway/batches/): the ids that make
    every step idempotent through a restart (the uploaded file, the provider's batch), its
    state as we know it and when to look at it next.

    ``state``: building (its items are chosen, nothing uploaded) -> uploaded (input file id
    stored) -> submitted (provider batch id stored; ``provider_status`` is what the provider
    last said) -> ended (every item has its outcome). ``cancelling``: every job of it was
    cancelled, the provider is told to cancel."""

    id = CharField(max_length=36, primary_key=True)
    provider = CharField(max_length=64)  # the route entry the batch goes to
    model = CharField(max_length=128)
    state = CharField(max_length=16)
    provider_status = CharField(max_length=32, default='')  # validating | in_progress | …
    input_file_id = CharField(max_length=128, null=True)
    provider_batch_id = CharField(max_length=128, null=True)
    output_file_id = CharField(max_length=128, null=True)
    error_file_id = CharField(max_length=128, null=True)
    job_count = IntegerField(default=0)
    succeeded_count = IntegerField(default=0)  # lines answered
    failed_count = IntegerField(default=0)  # lines that failed, expired or were cancelled
    cost = DecimalField(max_digits=14, decimal_places=6, default=0)  # at the batch price
    poll_count = IntegerField(default=0)
    next_poll_at = Timestamp(null=True)
    created_at = Timestamp()
    submitted_at = Timestamp(null=True)
    ended_at = Timestamp(null=True)
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_provider_batch'
        indexes = ((('state', 'next_poll_at'), False), (('created_at',), False))


class AiProviderBatchItem(BaseModel):
    """One job's attempt waiting for, or sent in, a provider batch: the request exactly as the
    online path renders it, and the line's outcome. ``custom_id`` = '<job id>:<attempt>'.

    ``state``: waiting (no batch yet) -> batched (in ``batch_id``) -> answered (``response``
    holds the line's body) | failed (``error_code``, ``response`` the line's error) | expired
    (goes online) | cancelled; consumed once the job's attempt has used the answer."""

    id = BigAutoField()
    job_id = CharField(max_length=36)
    attempt_no = IntegerField()
    custom_id = CharField(max_length=64)
    group_key = CharField(max_length=200)  # 'provider/model': jobs batched together
    batch_id = CharField(max_length=36, null=True)
    state = CharField(max_length=16)
    request = JSONText()  # the chat completion body the online path would send
    response = JSONText(null=True)  # the line's response body (answered)
    error_code = CharField(max_length=64, null=True)
    max_wait_ms = IntegerField()  # the job's BatchPolicy, when it was queued for a batch
    max_jobs = IntegerField()
    # The job's lock (its attempt_no) that was last deferred for this item: a job whose
    # attempt_no still equals it waits for this item alone, and its outcome wakes it.
    parked_attempt = IntegerField()
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_provider_batch_item'
        indexes = (
            (('custom_id',), True),
            (('job_id',), False),
            (('batch_id',), False),
            (('state', 'group_key', 'created_at'), False),
        )


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
    WebhookEndpoint,
    WebhookDelivery,
    LeaderLease,
    AiUserAdmission,
    DashboardSession,
    AppSecret,
    AiBudget,
    AiBudgetSpend,
    AiBudgetReservation,
    AiResponseCache,
    AiProviderBatch,
    AiProviderBatchItem,
)


# ---------------------------------------------------------------- canonical JSON
def canonical_json(value):
    return json.dumps(
        value, sort_keys=True, separators=(',', ':'), ensure_ascii=False, allow_nan=False
    )


def canonical_hash(value):
    return hashlib.sha256(canonical_json(value).encode('utf-8')).hexdigest()
