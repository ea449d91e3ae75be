"""AiJobService (contracts §2.4): the one way to create a job. The job row, its snapshot and its
``ai.job.enqueue`` outbox event are written in one transaction; an idempotency key makes a replay
return the first job instead of creating another."""

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from .admission import count_create, refuses_by_error
from .errors import (
    BudgetExceededError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    InvalidRequestError,
    JobNotCancellableError,
    JobNotRetryableError,
    QuotaExceededError,
    TooManyJobsError,
)
from .fairness import user_key
from .groupcommit import GroupCommit
from .history import CREATED, DISPATCHED, RETRIED, NewEvent, insert_events
from .models import AiJob, AiJobSnapshot, canonical_hash, new_id
from .outbox import ENQUEUE_EVENT
from .registry import first_error
from .signals import SILENT
from .sql import insert_row
from .states import CANCELLED, FAILED, TERMINAL
from .store import IntegrityError

OVERRIDE_FIELDS = (
    'priority',
    'credentialMode',
    'credentialId',
    'promptVersion',
    'outputSchemaVersion',
    'noCache',  # true: the response cache is neither read nor written for this job
)
DEFAULT_SNAPSHOT_TTL_MS = 30 * 24 * 3600 * 1000
BULK_RETRY_LIMIT = 500  # new jobs one bulk retry creates at most; run it again for more
INSERT_SNAPSHOT = (
    'INSERT INTO ai_job_snapshot (job_id, content, redaction_version, expires_at, created_at) '
    'VALUES '
)
SNAPSHOT_ROW = '(%s, %s, 1, {now_plus}, {now})'

# outbox_event.dedupe_key is VARCHAR(255) (schema.sql).
MAX_DEDUPE_KEY_CHARS = 255


# Groups of creates committing at once. The database shares one log flush among concurrent
# commits itself; creates waiting in this process for one group at a time lost more than the
# grouping saved (bench burst, 4 client threads, alternating: 603-627 jobs/s with 1, 746-778
# with 4).
CREATE_GROUPS = 4


@dataclass
class CreateJobInput:
    user_id: str
    job_type: str
    target_type: str
    target_id: str
    input: dict = field(default_factory=dict)
    idempotency_key: Optional[str] = None
    overrides: dict = field(default_factory=dict)
    retry_of_job_id: Optional[str] = None
    # The extensions' own fields of the create body that were given (not null), by name (a
    # job's webhookUrl, say): the hook point create_fields of engine/core/extension.py.
    extra: dict = field(default_factory=dict)
    created_by: Optional[str] = None  # the service whose key created it for user_id (issue 33)


@dataclass
class BulkRetry:
    """What ``retry_failed`` did: the new jobs, the failed jobs skipped (input purged) and
    refused (the user's limits), and whether more than the limit were waiting."""

    new_jobs: list
    skipped: int
    refused: int
    more: bool


class CreateResult(NamedTuple):
    job: AiJob
    created: bool  # False: an idempotent replay returned the existing job


class PushNow:
    """A service's ``dispatch_now``: pushes the events a create claimed, while ``on``; while off
    the service claims none and the dispatcher's polling publishes them. Its owner (the
    runtime) turns it on when the process starts running workers."""

    def __init__(self, push, on=True):
        self.push = push
        self.on = on

    def __call__(self, events):
        self.push(events)


class AiJobService:
    def __init__(
        self,
        store,
        registry,
        lifecycle,
        outbox,
        *,
        instance_id='service',
        dispatch_now=None,
        admission=None,
        cancel_signal=None,
        create_checks=(),
        signals=SILENT,
        create_fields=(),
        snapshot_ttl_ms=DEFAULT_SNAPSHOT_TTL_MS,
    ):
        self.store = store
        # With the creates of other threads (web requests) in one transaction, one commit; then
        # their events, claimed in it, pushed together.
        # Where a refused admission is its statement's error, the group's writes carry its
        # COMMIT: BEGIN, the rows and COMMIT in one round trip (architecture decision 10).
        self.creates = GroupCommit(
            store,
            after_commit=self._push_created,
            groups=CREATE_GROUPS,
            commit_with_rows=lambda: refuses_by_error(store),
        )
        self.snapshot_ttl_ms = snapshot_ttl_ms
        self.registry = registry
        self.lifecycle = lifecycle
        self.outbox = outbox
        self.instance_id = instance_id
        # dispatch_now(events): pushes events this instance claimed in the create transaction,
        # right after commit (architecture decision 6). None: the dispatcher's polling picks them
        # up.
        self.dispatch_now = dispatch_now
        # Admission: per-user limits (admission.Admission), checked as a create counts itself.
        # None: no limits, and the counters are kept all the same (limits turned on later find
        # them right).
        self.admission = admission
        # cancel_signal(job_id): the fast path telling a running job's worker to stop (the
        # ``job:cancel:{jobId}`` key); the database flag stays the source of truth.
        self.cancel_signal = cancel_signal
        # check(user_id, job_type) for each: the extensions' refusals of a create before it is
        # written (a spent budget in money: BudgetExceededError, 429); the hook point
        # create_checks of engine/core/extension.py.
        self.create_checks = create_checks
        # What it says as jobs are created and cancelled (core/signals.py).
        self.signals = signals
        # The extensions' fields of the create body (core.extension.CreateField): checked with
        # the request, written in its transaction, part of its fingerprint.
        self.create_fields = create_fields

    def check_request(self, request):
        """Validate a creation request as create_job would, writing nothing; returns its
        definition and normalised overrides."""
        definition = self.registry.get(request.job_type)
        overrides = validate_request(definition, request)
        unknown = sorted(set(request.extra) - {f.name for f in self.create_fields})
        if unknown:
            raise InvalidRequestError('%s is not a field of a job' % unknown[0], field=unknown[0])
        for extra in self._given(request):
            extra.check(request.user_id, request.extra[extra.name])
        return definition, overrides

    def _given(self, request):
        """The create fields ``request`` gives a value, in their order."""
        return [f for f in self.create_fields if request.extra.get(f.name) is not None]

    def create_job(self, request):
        definition, overrides = self.check_request(request)
        fingerprint = request_fingerprint(request, overrides)
        if request.idempotency_key is not None:
            existing = self._find_by_key(request)
            if existing is not None:
                return self._replay(existing, fingerprint)
        if self.admission is not None:
            self.admission.check_creatable(request, definition)
        for check in self.create_checks:
            check(request.user_id, definition.job_type)
        written = []  # the last run of the work is the one that committed

        def write(tx):
            written.append(self._insert(tx, definition, request, overrides, fingerprint))
            return written[-1]

        try:
            [failure] = self.creates.run([write])
            if failure is not None:
                raise failure
            job = written[-1][0]
        except IntegrityError:
            # Lost the race for the same idempotency key (contracts §2.4, last bullet): the winner
            # has committed; read it in a fresh transaction and answer as a replay.
            existing = self._find_by_key(request) if request.idempotency_key is not None else None
            if existing is None:
                raise
            return self._replay(existing, fingerprint)
        self.signals.job_created(job.job_type, job.queue_name)
        return CreateResult(job, True)

    def _pushes_now(self):
        """Does this process push its new jobs at once, claiming their events as it creates?"""
        return self.dispatch_now is not None and self.dispatch_now.on

    def _push_created(self, outputs):
        """After a group of creates committed: the events they claimed, pushed in one call."""
        claimed = [event for _, event in outputs if event.locked_by == self.instance_id]
        if claimed and self._pushes_now():
            self.dispatch_now(claimed)

    def _insert(self, tx, definition, request, overrides, fingerprint):
        job_id = new_id()
        # In a group's round trip the count goes out after every other row (count_create writes
        # it ``last``): its upsert locks the user's admission row until the COMMIT.
        if self.admission is None:
            count_create(self.store, request.user_id, job_id)
        else:
            self.admission.admit(request.user_id, job_id)  # raises the limit it would pass
        job = self.lifecycle.create_job(
            tx,
            job_id=job_id,
            user_id=request.user_id,
            job_type=definition.job_type,
            queue_name=definition.queue.queue_name,
            priority=overrides.get('priority', definition.queue.default_priority),
            target_type=request.target_type,
            target_id=request.target_id,
            idempotency_key=request.idempotency_key,
            request_fingerprint=fingerprint,
            credential_mode=overrides.get('credentialMode', definition.credential.default_mode),
            credential_id=overrides.get('credentialId'),
            prompt_version=overrides.get('promptVersion'),
            output_schema_version=overrides.get(
                'outputSchemaVersion', definition.output.schema_version
            ),
            max_retry_count=definition.execution.max_retries,
            retry_of_job_id=request.retry_of_job_id,
        )
        content = AiJobSnapshot.content.db_value({'input': request.input, 'overrides': overrides})
        insert_row(
            INSERT_SNAPSHOT,
            SNAPSHOT_ROW,
            (job_id, content, self.store.ms_param(self.snapshot_ttl_ms)),
        )
        claimed_by = self.instance_id if self._pushes_now() else None
        event = self.outbox.create_in_transaction(
            tx,
            event_type=ENQUEUE_EVENT,
            aggregate_type='AiJob',
            aggregate_id=job_id,
            dedupe_key=enqueue_dedupe_key(request, job_id),
            payload=enqueue_payload(job),
            claimed_by=claimed_by,
        )
        retried_attempt = None
        if job.retry_of_job_id:  # an admin retry: the old job's history says so too
            retried_attempt = (
                AiJob.select(AiJob.attempt_no).where(AiJob.id == job.retry_of_job_id).scalar()
            )
        insert_events(
            self.store, creation_events(job, claimed_by, retried_attempt, request.created_by)
        )
        for extra in self._given(request):
            extra.write(request.user_id, job_id, request.extra[extra.name])
        return job, event

    def _find_by_key(self, request):
        return AiJob.get_or_none(
            (AiJob.user_id == request.user_id)
            & (AiJob.job_type == request.job_type)
            & (AiJob.idempotency_key == request.idempotency_key)
        )

    def _replay(self, existing, fingerprint):
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyKeyReusedError(existing.id)
        return CreateResult(existing, False)

    def cancel_job(self, job_id):
        """Owner's cancel: queued → cancelled at once; running → cancel requested, and the
        worker is told. Raises JobNotCancellableError when terminal or when the job's definition
        says ``cancellable=False`` (nothing is written), JobAlreadyCancelledError when cancelled."""
        current = self.lifecycle.get(job_id)
        definition = self.registry.get(current.job_type)
        if not definition.execution.cancellable:
            raise JobNotCancellableError(
                job_id,
                current.lifecycle_status,
                CANCELLED,
                public_message='Jobs of this type cannot be cancelled.',
            )
        job = self.lifecycle.mark_cancelled(job_id)
        if job.lifecycle_status == CANCELLED:  # it was queued: finished now
            self.signals.job_finished(job.job_type, job.queue_name, CANCELLED)
        if job.lifecycle_status == 'running' and self.cancel_signal is not None:
            self.cancel_signal(job_id)
        return job

    def retry_job(self, job_id):
        """Admin retry (contracts §7.1): a new job for the same user, target, input and overrides as
        a failed or cancelled one, linked by ``retry_of_job_id``. The old job stays as it is."""
        old = self.lifecycle.get(job_id)
        if old.lifecycle_status not in (FAILED, CANCELLED):
            raise JobNotRetryableError('job %s is %s' % (job_id, old.lifecycle_status))
        snapshot = AiJobSnapshot.get_or_none(AiJobSnapshot.job_id == job_id)
        if snapshot is None:
            raise JobNotRetryableError('job %s has no snapshot left' % job_id)
        return self.create_job(
            CreateJobInput(
                user_id=old.user_id,
                job_type=old.job_type,
                target_type=old.target_type,
                target_id=old.target_id,
                input=snapshot.content['input'],
                overrides=snapshot.content.get('overrides') or {},
                retry_of_job_id=old.id,
            )
        ).job

    def retry_failed(self, job_type, since, limit=BULK_RETRY_LIMIT):
        """Admin bulk retry: ``retry_job`` for each failed job of ``job_type`` that finished at
        or after ``since`` (naive UTC) and has not been retried yet, oldest first, at most
        ``limit``. Each retry is its own transaction, so running it again goes on where it
        stopped, and a retried job is never retried twice. A job whose input was purged is
        skipped; one whose user is over a limit (429) is refused and stays for a later run.
        Returns a BulkRetry."""
        retried = AiJob.select(AiJob.retry_of_job_id).where(
            AiJob.retry_of_job_id.is_null(False) & (AiJob.job_type == job_type)
        )
        candidates = list(
            AiJob.select(AiJob.id)
            .where(
                (AiJob.finished_at >= since)
                & (AiJob.lifecycle_status == FAILED)
                & (AiJob.job_type == job_type)
                & AiJob.id.not_in(retried)
            )
            .order_by(AiJob.finished_at, AiJob.id)
            .limit(limit + 1)
        )
        result = BulkRetry([], 0, 0, len(candidates) > limit)
        for job in candidates[:limit]:
            try:
                result.new_jobs.append(self.retry_job(job.id))
            except JobNotRetryableError:
                result.skipped += 1  # its snapshot was purged: nothing to run it on
            except (TooManyJobsError, QuotaExceededError, BudgetExceededError):
                result.refused += 1  # the user's limits: it stays failed, for a later run
        return result

    def snapshot(self, job_id):
        """The frozen ``{"input", "overrides"}`` a job runs on."""
        return AiJobSnapshot.get(AiJobSnapshot.job_id == job_id).content

    def purge_expired_snapshots(self, limit=1000):
        """Delete up to ``limit`` snapshots past their ``expires_at`` whose job has finished (a
        queued or running job still needs its input). Returns how many were deleted."""
        ids = [
            row.id
            for row in AiJobSnapshot.select(AiJobSnapshot.id)
            .join(AiJob, on=(AiJob.id == AiJobSnapshot.job_id))
            .where(
                (AiJobSnapshot.expires_at < self.store.now())
                & AiJob.lifecycle_status.in_(sorted(TERMINAL))
            )
            .limit(limit)
        ]
        if not ids:
            return 0
        return AiJobSnapshot.delete().where(AiJobSnapshot.id.in_(ids)).execute()


def creation_events(job, claimed_by, retried_attempt=None, created_by=None):
    """The history's first rows: ``created``, and ``dispatched`` when this process claimed the
    outbox event to push it right after commit (architecture decision 6): both in the creating
    transaction, so the push can never come before its row. A retry of an old job adds the old
    job's ``retried`` row (at its last attempt, ``retried_attempt``). ``created_by``: the
    service that created the job for its user, named in the ``created`` row."""
    detail = {'queue': job.queue_name, 'priority': job.priority}
    if job.retry_of_job_id:
        detail['retryOfJobId'] = job.retry_of_job_id
    if created_by:
        detail['service'] = created_by
    events = [NewEvent(job.id, CREATED, 0, detail)]
    if claimed_by:
        events.append(
            NewEvent(job.id, DISPATCHED, 0, {'queue': job.queue_name, 'dispatcher': claimed_by})
        )
    if job.retry_of_job_id:
        events.append(
            NewEvent(job.retry_of_job_id, RETRIED, retried_attempt or 0, {'retryJobId': job.id})
        )
    return events


def enqueue_payload(job):
    """contracts §8.5: the event carries ids only — no user, credential or snapshot content;
    the user's opaque queue key (core/fairness.py) for the queue's fair turns."""
    return {
        'jobId': job.id,
        'jobType': job.job_type,
        'queueName': job.queue_name,
        'priority': job.priority,
        'userKey': user_key(job.user_id),
    }


def enqueue_dedupe_key(request, job_id):
    """contracts §4.1: ``{jobType}:{userId}:{idempotencyKey}``, the job id standing in for the
    key. Longer than the column (a key near its 255 characters with a long job type and user):
    ``sha256:`` and the hex digest of that text instead, which has one colon where the plain
    form has at least two, so the two forms never meet."""
    key = '%s:%s:%s' % (request.job_type, request.user_id, request.idempotency_key or job_id)
    if len(key) <= MAX_DEDUPE_KEY_CHARS:
        return key
    return 'sha256:' + hashlib.sha256(key.encode('utf-8')).hexdigest()


def request_fingerprint(request, overrides):
    """What makes two creations "the same request" for idempotency (architecture decision 7);
    an extension's field (a webhookUrl) counts only when given, so the fingerprints of requests
    without one stay."""
    fields = {
        'jobType': request.job_type,
        'targetType': request.target_type,
        'targetId': request.target_id,
        'input': request.input,
        'overrides': overrides,
    }
    fields.update((name, value) for name, value in request.extra.items() if value is not None)
    return canonical_hash(fields)


# ---------------------------------------------------------------- request validation
def validate_request(definition, request):
    """Check a creation request against its definition before anything is written. Returns the
    normalised overrides; raises InvalidRequestError / InvalidInputError naming the field."""
    _require_text(request.user_id, 'userId', 64)
    _require_text(request.target_type, 'targetType', 64)
    _require_text(request.target_id, 'targetId', 128)
    if request.idempotency_key is not None:
        _require_text(request.idempotency_key, 'idempotencyKey', 255)
    if not isinstance(request.input, dict):
        raise InvalidInputError('input must be a JSON object', field='input')
    if definition.input.schema is not None:
        _validate_input(definition.input.schema, request.input)
    return _validate_overrides(definition, request.overrides or {})


def _validate_input(schema, value):
    error = first_error(schema, value)
    if error is not None:
        path = ''.join('[%d]' % p if isinstance(p, int) else '.%s' % p for p in error.absolute_path)
        raise InvalidInputError('input%s: %s' % (path, error.message), field='input' + path)


def _validate_overrides(definition, overrides):
    if not isinstance(overrides, dict):
        raise InvalidRequestError('overrides must be a JSON object', field='overrides')
    unknown = sorted(set(overrides) - set(OVERRIDE_FIELDS))
    if unknown:
        raise InvalidRequestError(
            'overrides.%s is not a known override (allowed: %s)'
            % (unknown[0], ', '.join(OVERRIDE_FIELDS)),
            field='overrides.' + unknown[0],
        )
    result = {k: v for k, v in overrides.items() if v is not None}
    priority = result.get('priority')
    if isinstance(priority, float) and priority.is_integer():
        priority = result['priority'] = int(priority)  # 48.0 is the JSON integer 48
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 100
    ):
        raise InvalidRequestError(
            'overrides.priority must be an integer 0..100', field='overrides.priority'
        )
    mode = result.get('credentialMode', definition.credential.default_mode)
    if mode not in definition.credential.allowed_modes:
        raise InvalidRequestError(
            'overrides.credentialMode %r is not allowed for %s (allowed: %s)'
            % (mode, definition.job_type, ', '.join(definition.credential.allowed_modes)),
            field='overrides.credentialMode',
        )
    if mode == 'user_deepseek_key':
        _require_text(result.get('credentialId'), 'overrides.credentialId', 36)
    elif 'credentialId' in result:
        raise InvalidRequestError(
            'overrides.credentialId is only used with credentialMode user_deepseek_key',
            field='overrides.credentialId',
        )
    for name in ('promptVersion', 'outputSchemaVersion'):
        if name in result:
            _require_text(result[name], 'overrides.' + name, 32)
    if not isinstance(result.get('noCache', False), bool):
        raise InvalidRequestError('overrides.noCache must be a boolean', field='overrides.noCache')
    return result


def _require_text(value, name, max_length):
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(
            '%s is required and must be a non-empty string' % name, field=name
        )
    if len(value) > max_length:
        raise InvalidRequestError(
            '%s must be at most %d characters' % (name, max_length), field=name
        )
