"""JobDefinition (contracts §2.1) and JobDefinitionRegistry (contracts §2.2): what each jobType is
and how it runs, validated once at registration so a bad definition stops start-up, not a job."""

import re
from dataclasses import dataclass, field
from typing import Optional

import jsonschema

from .errors import (
    DuplicateJobDefinitionError,
    InvalidCredentialPolicyError,
    InvalidDefinitionError,
    InvalidJobTypeError,
    InvalidPriorityError,
    InvalidQueueError,
    InvalidRetryPolicyError,
    InvalidTimeoutError,
    UnknownJobTypeError,
)

QUEUE_NAMES = ('ai-interactive', 'ai-background')
DOMAINS = ('analysis', 'generation', 'import', 'maintenance')
CREDENTIAL_MODES = ('platform_key', 'user_deepseek_key')
ABORT_STRATEGIES = ('fail', 'retry')
JOB_TYPE_PATTERN = re.compile(r'^[a-z][a-z0-9_]{1,63}$')
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 1_000, 600_000
MAX_RETRIES = 10
CACHE_SCOPES = ('user', 'global')
MAX_CACHE_TTL_MS = 30 * 24 * 3600 * 1000  # a cached answer older than a month is stale anyway
BATCH_QUEUE = 'ai-background'  # only jobs that can wait hours go to a provider's batch API
MAX_BATCH_WAIT_MS = 24 * 3600 * 1000  # a batch that waits longer than its window is pointless
# OpenAI takes up to 50 000 requests a batch; the batcher looks at 5000 waiting items a step
# (batches.batcher.FORM_SCAN), so a larger max_jobs would never be reached by count.
MAX_BATCH_JOBS = 5000


@dataclass(frozen=True)
class Metadata:
    label: str
    description: str
    domain: str
    version: str


@dataclass(frozen=True)
class QueuePolicy:
    queue_name: str
    default_priority: int = 50  # 0 = highest, 100 = lowest


@dataclass(frozen=True)
class RetryBackoff:
    delay: int = 1000  # ms before the first retry; doubles each time
    type: str = 'exponential'

    def delay_ms(self, retry_number):
        """Wait before retry ``retry_number`` (1 = the first retry)."""
        return self.delay * (2 ** (retry_number - 1))


@dataclass(frozen=True)
class ExecutionPolicy:
    timeout_ms: int
    max_retries: int  # not counting the first attempt
    retry_backoff: RetryBackoff = field(default_factory=RetryBackoff)
    cancellable: bool = True
    abort_strategy: str = 'fail'  # after a timeout: 'fail' or 'retry'


@dataclass(frozen=True)
class InputSpec:
    schema_version: str
    schema: Optional[dict] = None  # JSON Schema the job input must satisfy


@dataclass(frozen=True)
class OutputSpec:
    schema_version: str
    validator: Optional[dict] = None  # JSON Schema the provider output must satisfy


@dataclass(frozen=True)
class CredentialPolicy:
    allowed_modes: tuple = ('platform_key',)
    default_mode: str = 'platform_key'


@dataclass(frozen=True)
class SecurityPolicy:
    content_safety_check: bool = False


@dataclass(frozen=True)
class CachePolicy:
    """The response cache, opt-in per definition: an identical request (provider, model, prompt,
    rendered messages, sampling, output schema version) answered within ``ttl_ms`` is answered
    again from the cache. ``scope``: 'user' (the default: one user's output never reaches
    another) or 'global'."""

    ttl_ms: int
    scope: str = 'user'


@dataclass(frozen=True)
class BatchPolicy:
    """Provider batches (engine/features/batches/), opt-in per definition: the jobs of the
    definition that run on ``ai-background`` are sent in a provider's batch API at its batch
    price, a batch formed when ``max_jobs`` wait or the oldest has waited ``max_wait_ms``."""

    max_wait_ms: int
    max_jobs: int


def validate_batch_policy(where, batch):
    """Raise InvalidDefinitionError naming ``where`` when ``batch`` is no valid BatchPolicy."""
    if not isinstance(batch, BatchPolicy):
        raise InvalidDefinitionError('%s: batch must be a BatchPolicy' % where)
    if not _is_int(batch.max_wait_ms) or not 1 <= batch.max_wait_ms <= MAX_BATCH_WAIT_MS:
        raise InvalidDefinitionError(
            '%s: batch.maxWaitMs %r must be 1..%d' % (where, batch.max_wait_ms, MAX_BATCH_WAIT_MS)
        )
    if not _is_int(batch.max_jobs) or not 1 <= batch.max_jobs <= MAX_BATCH_JOBS:
        raise InvalidDefinitionError(
            '%s: batch.maxJobs %r must be 1..%d' % (where, batch.max_jobs, MAX_BATCH_JOBS)
        )


@dataclass(frozen=True)
class JobDefinition:
    job_type: str
    metadata: Metadata
    queue: QueuePolicy
    execution: ExecutionPolicy
    input: InputSpec
    output: OutputSpec
    credential: CredentialPolicy = field(default_factory=CredentialPolicy)
    projector: Optional[str] = None  # ResultProjector key; None = the built-in JSON artifact
    security: SecurityPolicy = field(default_factory=SecurityPolicy)
    provider: Optional[str] = None  # AI provider key; None = the configured default
    route: Optional[str] = None  # a route of AIJOB_PROVIDERS (a fallback chain), instead
    cache: Optional[CachePolicy] = None  # the response cache; None = never cached
    batch: Optional[BatchPolicy] = None  # provider batches (ai-background only); None = online
    api_creatable: bool = True  # may clients create it through POST /api/ai/jobs?


class JobDefinitionRegistry:
    def __init__(self):
        self._definitions = {}

    def register(self, definition):
        if definition.job_type in self._definitions:
            raise DuplicateJobDefinitionError(
                'jobType %r is already registered' % (definition.job_type,)
            )
        validate_definition(definition)
        self._definitions[definition.job_type] = definition

    def get(self, job_type):
        try:
            return self._definitions[job_type]
        except (KeyError, TypeError):
            raise UnknownJobTypeError(job_type) from None

    def get_all(self):
        return list(self._definitions.values())


def validate_definition(d):
    """The start-up checks of contracts §2.2, each failure its own error type."""
    if not isinstance(d.job_type, str) or not JOB_TYPE_PATTERN.match(d.job_type):
        raise InvalidJobTypeError(
            'jobType %r must match %s' % (d.job_type, JOB_TYPE_PATTERN.pattern)
        )
    if d.queue.queue_name not in QUEUE_NAMES:
        raise InvalidQueueError(
            '%s: queue %r is not one of %s'
            % (d.job_type, d.queue.queue_name, ', '.join(QUEUE_NAMES))
        )
    if not _is_int(d.queue.default_priority) or not 0 <= d.queue.default_priority <= 100:
        raise InvalidPriorityError('%s: defaultPriority must be 0..100' % d.job_type)
    timeout = d.execution.timeout_ms
    if not _is_int(timeout) or not MIN_TIMEOUT_MS <= timeout <= MAX_TIMEOUT_MS:
        raise InvalidTimeoutError(
            '%s: timeoutMs %r must be %d..%d'
            % (d.job_type, timeout, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)
        )
    _validate_retry_policy(d)
    _validate_credential_policy(d)
    _validate_descriptive_fields(d)
    _validate_cache_policy(d)
    _validate_batch(d)


def _validate_batch(d):
    if d.batch is None:
        return
    validate_batch_policy(d.job_type, d.batch)
    if d.queue.queue_name != BATCH_QUEUE:
        raise InvalidDefinitionError(
            '%s: batch needs queue %s (a batch may take hours)' % (d.job_type, BATCH_QUEUE)
        )


def _validate_cache_policy(d):
    cache = d.cache
    if cache is None:
        return
    if not isinstance(cache, CachePolicy):
        raise InvalidDefinitionError('%s: cache must be a CachePolicy' % d.job_type)
    if not _is_int(cache.ttl_ms) or not 1 <= cache.ttl_ms <= MAX_CACHE_TTL_MS:
        raise InvalidDefinitionError(
            '%s: cache.ttlMs %r must be 1..%d' % (d.job_type, cache.ttl_ms, MAX_CACHE_TTL_MS)
        )
    if cache.scope not in CACHE_SCOPES:
        raise InvalidDefinitionError(
            '%s: cache.scope must be one of %s' % (d.job_type, ', '.join(CACHE_SCOPES))
        )


def _validate_retry_policy(d):
    e = d.execution
    if not _is_int(e.max_retries) or not 0 <= e.max_retries <= MAX_RETRIES:
        raise InvalidRetryPolicyError('%s: maxRetries must be 0..%d' % (d.job_type, MAX_RETRIES))
    if (
        e.retry_backoff.type != 'exponential'
        or not _is_int(e.retry_backoff.delay)
        or e.retry_backoff.delay < 0
    ):
        raise InvalidRetryPolicyError(
            '%s: retryBackoff must be exponential with delay >= 0 ms' % d.job_type
        )
    if e.abort_strategy not in ABORT_STRATEGIES:
        raise InvalidRetryPolicyError(
            '%s: abortStrategy must be one of %s' % (d.job_type, ', '.join(ABORT_STRATEGIES))
        )


def _validate_credential_policy(d):
    c = d.credential
    modes = tuple(c.allowed_modes)
    if not modes or any(mode not in CREDENTIAL_MODES for mode in modes):
        raise InvalidCredentialPolicyError(
            '%s: allowedModes must be a non-empty subset of %s'
            % (d.job_type, ', '.join(CREDENTIAL_MODES))
        )
    if c.default_mode not in modes:
        raise InvalidCredentialPolicyError(
            '%s: defaultMode %r is not an allowed mode' % (d.job_type, c.default_mode)
        )


def _validate_descriptive_fields(d):
    if d.metadata.domain not in DOMAINS:
        raise InvalidDefinitionError(
            '%s: domain must be one of %s' % (d.job_type, ', '.join(DOMAINS))
        )
    if not d.metadata.label or not d.metadata.version:
        raise InvalidDefinitionError('%s: metadata needs a label and a version' % d.job_type)
    if not d.input.schema_version or not d.output.schema_version:
        raise InvalidDefinitionError('%s: input and output need a schemaVersion' % d.job_type)
    for name, schema in (
        ('input.schema', d.input.schema),
        ('output.validator', d.output.validator),
    ):
        if schema is None:
            continue
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise InvalidDefinitionError(
                '%s: %s is not a valid JSON Schema: %s' % (d.job_type, name, exc.message)
            ) from None
    if d.projector is not None and not (isinstance(d.projector, str) and d.projector):
        raise InvalidDefinitionError('%s: projector must be a non-empty key' % d.job_type)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


_VALIDATORS = {}  # id(schema) -> (schema, validator); the schema is kept so its id is not reused


def validator_for(schema):
    """The compiled Draft 2020-12 validator of a definition's schema, built once per schema:
    building one costs more than validating a small document with it."""
    entry = _VALIDATORS.get(id(schema))
    if entry is None or entry[0] is not schema:
        entry = (schema, jsonschema.Draft202012Validator(schema))
        _VALIDATORS[id(schema)] = entry
    return entry[1]


def first_error(schema, value):
    """The most relevant jsonschema error of ``value``, or None when it is valid."""
    validator = validator_for(schema)
    if validator.is_valid(value):
        return None
    return jsonschema.exceptions.best_match(validator.iter_errors(value))
