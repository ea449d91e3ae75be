"""One root error for the engine; every error carries its public code, HTTP status and retryability.

Callers branch on attributes (``code``, ``retryable``, ``http_status``), never on long ``except``
ladders. ``public_message`` is safe to show to an end user; ``str(error)`` may hold internals and
is only for logs without job content and for SUPER_ADMIN (contracts §7.4, §8.3).
"""


class AiJobError(Exception):
    code = 'INTERNAL_ERROR'
    http_status = 500
    retryable = False
    public_message = 'The request could not be processed.'

    def __init__(self, message=None, *, public_message=None):
        super().__init__(message or self.public_message)
        if public_message is not None:
            self.public_message = public_message


# ---------------------------------------------------------------- configuration and start-up
class ConfigError(AiJobError):
    code = 'CONFIG_INVALID'


# ---------------------------------------------------------------- registry (contracts §2.2)
class RegistryError(AiJobError):
    code = 'DEFINITION_INVALID'


class DuplicateJobDefinitionError(RegistryError):
    code = 'DEFINITION_DUPLICATE'


class InvalidJobTypeError(RegistryError):
    code = 'DEFINITION_INVALID_JOB_TYPE'


class InvalidQueueError(RegistryError):
    code = 'DEFINITION_INVALID_QUEUE'


class InvalidTimeoutError(RegistryError):
    code = 'DEFINITION_INVALID_TIMEOUT'


class InvalidPriorityError(RegistryError):
    code = 'DEFINITION_INVALID_PRIORITY'


class InvalidRetryPolicyError(RegistryError):
    code = 'DEFINITION_INVALID_RETRY_POLICY'


class InvalidCredentialPolicyError(RegistryError):
    code = 'DEFINITION_INVALID_CREDENTIAL_POLICY'


class InvalidDefinitionError(RegistryError):
    """Any other rule of a definition (domain, schemas, projector key)."""


class UnknownJobTypeError(AiJobError):
    code = 'UNKNOWN_JOB_TYPE'
    http_status = 400

    def __init__(self, job_type):
        super().__init__(
            'unknown jobType %r' % (job_type,), public_message='Unknown jobType %r.' % (job_type,)
        )
        self.job_type = job_type


# ---------------------------------------------------------------- requests
class InvalidRequestError(AiJobError):
    code = 'INVALID_REQUEST'
    http_status = 400
    public_message = 'The request is invalid.'

    def __init__(self, message, *, field=None):
        super().__init__(message, public_message=message)
        self.field = field


class InvalidInputError(InvalidRequestError):
    code = 'INVALID_INPUT'


class WebhookUrlRefusedError(InvalidRequestError):
    """A webhook URL that is not https (unless allowed), or resolves to a loopback, link-local
    or private address (unless allowed), or does not resolve at all."""

    code = 'WEBHOOK_URL_REFUSED'


class IdempotencyKeyReusedError(AiJobError):
    code = 'IDEMPOTENCY_KEY_REUSED'
    http_status = 422
    public_message = (
        'This idempotency key was already used with a different request; '
        'use a new key for a new request.'
    )

    def __init__(self, job_id):
        super().__init__('idempotency key reused with a different request (job %s)' % job_id)
        self.job_id = job_id


class TooManyJobsError(AiJobError):
    code = 'TOO_MANY_JOBS'
    http_status = 429
    public_message = 'Too many unfinished jobs; wait for some to finish.'
    retry_after_s = 5


class QuotaExceededError(AiJobError):
    code = 'QUOTA_EXCEEDED'
    http_status = 429
    public_message = 'Daily job quota used up.'

    def __init__(self, retry_after_s):
        super().__init__()
        self.retry_after_s = retry_after_s


class BudgetExceededError(AiJobError):
    """A create refused because a budget that applies to it is spent
    (engine/features/budgets/ledger.py): the message names the budget and when its period
    resets; Retry-After is the time to it."""

    code = 'BUDGET_EXCEEDED'
    http_status = 429
    public_message = 'A budget that applies to this job is spent.'

    def __init__(self, message, retry_after_s=None):
        super().__init__(message, public_message=message)
        self.retry_after_s = retry_after_s


class PlatformUnavailableError(AiJobError):
    code = 'PLATFORM_UNAVAILABLE'
    http_status = 503
    public_message = 'The AI platform is unavailable; try again later.'
    retry_after_s = 30


# ---------------------------------------------------------------- jobs and the state machine (§1)
class JobNotFoundError(AiJobError):
    code = 'JOB_NOT_FOUND'
    http_status = 404
    public_message = 'Job not found.'

    def __init__(self, job_id):
        super().__init__('job %s not found' % (job_id,))
        self.job_id = job_id


class IllegalTransitionError(AiJobError):
    """An edge that contracts §1.3 forbids; nothing was written."""

    code = 'ILLEGAL_TRANSITION'
    http_status = 409
    public_message = 'The job is not in a state that allows this.'

    def __init__(self, job_id, from_status, to_status, *, public_message=None):
        super().__init__(
            'job %s: %s -> %s is not a legal transition' % (job_id, from_status, to_status),
            public_message=public_message,
        )
        self.job_id, self.from_status, self.to_status = job_id, from_status, to_status


class FinishWrittenError(IllegalTransitionError):
    """A fenced terminal write found its job already in that status, written by that same
    fence: an earlier try of the write committed, and its answer was lost with the connection.
    Nothing more to write."""

    def __init__(self, job_id, status):
        super().__init__(job_id, status, status)
        self.status = status


class JobNotCancellableError(IllegalTransitionError):
    code = 'JOB_NOT_CANCELLABLE'
    public_message = 'The job has already finished and cannot be cancelled.'


class JobAlreadyCancelledError(IllegalTransitionError):
    code = 'JOB_ALREADY_CANCELLED'
    public_message = 'The job has already been cancelled.'


class JobNotRetryableError(AiJobError):
    """An admin retry of a job that did not fail or was not cancelled, or whose snapshot is gone."""

    code = 'JOB_NOT_RETRYABLE'
    http_status = 409
    public_message = 'Only a failed or cancelled job whose input is still kept can be retried.'


class JobLockConflictError(AiJobError):
    """A compare-and-set lost: another worker holds the lock, or this worker's fence is stale."""

    code = 'JOB_LOCK_CONFLICT'
    http_status = 409
    public_message = 'The job is being processed elsewhere.'

    def __init__(self, job_id, reason='lock held by another worker'):
        super().__init__('job %s: %s' % (job_id, reason))
        self.job_id = job_id


# ---------------------------------------------------------------- infrastructure at the edges
class StoreUnavailableError(AiJobError):
    """The database could not be reached; nothing was written, and the client may try again."""

    code = 'STORE_UNAVAILABLE'
    http_status = 503
    retryable = True
    retry_after_s = 5
    public_message = 'The service is temporarily unavailable; try again later.'


class QueueUnavailableError(StoreUnavailableError):
    """The queue backend could not be reached (a Redis outage); callers back off."""

    code = 'QUEUE_UNAVAILABLE'


# ---------------------------------------------------------------- the HTTP layer (contracts §7.3)
class HttpError(AiJobError):
    """An error of the HTTP layer itself: the body, the token, the route."""

    def __init__(self, message=None):
        super().__init__(message, public_message=message)


class InvalidJsonError(HttpError):
    code = 'INVALID_JSON'
    http_status = 400
    public_message = 'The request body is not valid JSON.'


class UnauthorizedError(HttpError):
    code = 'UNAUTHORIZED'
    http_status = 401
    public_message = 'A valid bearer token is required (Authorization: Bearer …).'


class ForbiddenError(HttpError):
    code = 'FORBIDDEN'
    http_status = 403
    public_message = 'This endpoint is for SUPER_ADMIN only.'


class CsrfError(HttpError):
    """A dashboard action without its session's CSRF token, or posted from another origin."""

    code = 'CSRF_TOKEN_INVALID'
    http_status = 403
    public_message = 'The form is stale or came from another site; reload the page and retry.'


class NoSuchEndpointError(HttpError):
    code = 'NOT_FOUND'
    http_status = 404
    public_message = 'No such endpoint.'


class WebhookNotFoundError(HttpError):
    code = 'WEBHOOK_NOT_FOUND'
    http_status = 404
    public_message = 'No such webhook endpoint of yours.'


class WebhookDeliveryNotFoundError(HttpError):
    code = 'WEBHOOK_DELIVERY_NOT_FOUND'
    http_status = 404
    public_message = 'No such webhook delivery.'


class WebhookDeliveryInFlightError(HttpError):
    code = 'WEBHOOK_DELIVERY_IN_FLIGHT'
    http_status = 409
    public_message = 'The delivery is being sent right now; try again once it has an outcome.'


class BudgetNotFoundError(HttpError):
    code = 'BUDGET_NOT_FOUND'
    http_status = 404
    public_message = 'No such budget.'


class TokenNotFoundError(HttpError):
    code = 'TOKEN_NOT_FOUND'
    http_status = 404
    public_message = 'No such live API token.'


class BatchNotFoundError(HttpError):
    code = 'BATCH_NOT_FOUND'
    http_status = 404
    public_message = 'No such provider batch.'


class WebhooksUnavailableError(HttpError):
    code = 'WEBHOOKS_UNAVAILABLE'
    http_status = 503
    retry_after_s = 60
    public_message = 'Webhooks are not enabled on this server (no signing key is configured).'


class UnknownCredentialError(HttpError):
    code = 'CREDENTIAL_NOT_FOUND'
    http_status = 404
    public_message = 'Credential not found.'


class MethodNotAllowedError(HttpError):
    code = 'METHOD_NOT_ALLOWED'
    http_status = 405
    public_message = 'Method not allowed on this endpoint.'


class PayloadTooLargeError(HttpError):
    code = 'PAYLOAD_TOO_LARGE'
    http_status = 413
    public_message = 'The request body is too large.'


class UnsupportedMediaTypeError(HttpError):
    code = 'UNSUPPORTED_MEDIA_TYPE'
    http_status = 415
    public_message = 'The request body must be application/json.'


class RequestTimeoutError(HttpError):
    code = 'REQUEST_TIMEOUT'
    http_status = 408
    public_message = 'The request body did not arrive in time.'


class TooManyWaitersError(HttpError):
    code = 'TOO_MANY_WAITERS'
    http_status = 429
    retry_after_s = 1
    public_message = 'Too many requests are waiting for a change (waitMs); retry later.'


class TooManyStreamsError(HttpError):
    code = 'TOO_MANY_STREAMS'
    http_status = 429
    retry_after_s = 5
    public_message = 'Too many job event streams are open; close one or retry later.'


# What gunicorn itself refuses before the app sees a request (its own answers are made JSON too).
class RequestLineTooLongError(HttpError):
    code = 'URI_TOO_LONG'
    http_status = 414
    public_message = 'The request line is too long.'


class ExpectationFailedError(HttpError):
    code = 'EXPECTATION_FAILED'
    http_status = 417
    public_message = 'The Expect header cannot be met.'


class HeadersTooLargeError(HttpError):
    code = 'HEADERS_TOO_LARGE'
    http_status = 431
    public_message = 'The request headers are too large or too many.'


class UnsupportedTransferCodingError(HttpError):
    code = 'UNSUPPORTED_TRANSFER_CODING'
    http_status = 501
    public_message = 'The request uses a transfer coding this server does not support.'


class NotReadyError(HttpError):
    code = 'NOT_READY'
    http_status = 503
    retry_after_s = 5
    public_message = 'A dependency of the service is unreachable.'


# -------------------------------------------------------------- execution failures (contracts §5.2)
MAX_INTERNAL_RETRIES = 1  # contracts §5.2: INTERNAL_* is retried at most once


class JobFailure(AiJobError):
    """One attempt of a job failed. ``code`` is one of contracts §5.2's classes; the engine decides,
    from ``retryable`` alone, whether to try again."""

    code = 'INTERNAL_ERROR'
    retryable = False
    public_message = 'The job failed.'

    def __init__(self, message=None, *, code=None, public_message=None, retry_after_s=None):
        super().__init__(message, public_message=public_message)
        if code is not None:
            self.code = code
        self.retry_after_s = retry_after_s

    def may_retry(self, abort_strategy, internal_retries_used):
        """The one rule for whether another provider call may follow this failure (the retry
        budget, ``maxRetryCount``, is the engine's to count)."""
        return self.retryable


class ProviderError(JobFailure):
    code = 'PROVIDER_ERROR'
    retryable = True
    public_message = 'The AI provider did not answer properly; please try again later.'


class ProviderRequestError(JobFailure):
    """The provider rejected the request itself (400, context too long): retrying cannot help."""

    code = 'PROVIDER_BAD_REQUEST'
    retryable = False
    public_message = 'The AI provider rejected the request.'


class OutputValidationError(JobFailure):
    code = 'VALIDATION_SCHEMA'
    retryable = True
    public_message = 'The AI output was not in the expected format.'


class ContentSafetyError(JobFailure):
    code = 'CONTENT_SAFETY_BLOCKED'
    retryable = False
    public_message = 'The content was blocked by the safety policy.'


class JobTimeoutError(JobFailure):
    code = 'TIMEOUT'
    public_message = 'The job took too long and was stopped.'

    def may_retry(self, abort_strategy, internal_retries_used):
        return abort_strategy == 'retry'  # the definition's abortStrategy decides (contracts §5.2)


class CredentialError(JobFailure):
    code = 'CREDENTIAL_INVALID'
    retryable = False
    public_message = 'The API key for this job is missing or invalid.'


class CredentialNotFoundError(CredentialError):
    """No such credential, or it belongs to another user (the two are indistinguishable)."""

    code = 'CREDENTIAL_NOT_FOUND'
    public_message = 'The API key chosen for this job does not exist.'


class CredentialUndecryptableError(CredentialError):
    """The stored ciphertext does not open under this master key (rotated or wrong key)."""

    code = 'CREDENTIAL_UNDECRYPTABLE'
    public_message = 'The API key chosen for this job can no longer be used; register it again.'


class CredentialStorageUnavailableError(AiJobError):
    code = 'CREDENTIAL_STORAGE_UNAVAILABLE'
    http_status = 503
    public_message = 'Storing API keys is not enabled on this server.'


class BudgetExceededFailure(JobFailure):
    """A provider call whose maximum cost would pass a budget: the job fails without the call,
    is not retried and does not fall back to another route entry (every entry spends from the
    same budget)."""

    code = 'BUDGET_EXCEEDED'
    retryable = False
    public_message = 'A budget that applies to this job is spent.'


class JobCancelledError(JobFailure):
    """The job must stop and end ``cancelled``: its owner asked, before or while it ran. Raised
    by the engine's checks and by the lifecycle when a cancel request beats the success write."""

    code = 'CANCELLED'
    retryable = False
    public_message = 'The job was cancelled.'


class JobDeferred(Exception):
    """Not a failure: the job must wait ``delay_s`` before its next provider call (a provider's
    rate limit is used up, or a budget that says ``wait`` is spent until its period resets).
    The engine hands the job back without spending a retry or holding a worker thread.
    ``reason`` says which rule deferred it (for the history and the logs). ``call_out`` says
    the call was handed on rather than dropped (parked in a provider batch): what the guards
    reserved for it stays reserved until its answer is used."""

    def __init__(self, delay_s, reason, detail=None, call_out=False):
        super().__init__('%s: deferred %.3f s' % (reason, delay_s))
        self.delay_s = max(0.0, float(delay_s))
        self.reason = reason
        self.detail = dict(detail or {})
        self.call_out = call_out


class InternalJobError(JobFailure):
    code = 'INTERNAL_ERROR'
    retryable = True
    public_message = 'An internal error occurred.'

    def may_retry(self, abort_strategy, internal_retries_used):
        return self.retryable and internal_retries_used < MAX_INTERNAL_RETRIES


class MisconfiguredJobError(InternalJobError):
    """This process lacks what the job needs (its job type, provider or projector): no retry
    of the same call can succeed."""

    retryable = False


_FAILURE_PREFIXES = (
    ('PROVIDER_BAD_REQUEST', ProviderRequestError),
    ('PROVIDER_', ProviderError),
    ('VALIDATION_', OutputValidationError),
    ('CONTENT_SAFETY_', ContentSafetyError),
    ('TIMEOUT', JobTimeoutError),
    ('CREDENTIAL_', CredentialError),
    ('CANCELLED', JobCancelledError),
    ('BUDGET_', BudgetExceededFailure),
    ('INTERNAL_', InternalJobError),
)


def failure_for_code(code, message=None):
    """The typed failure for a contracts §5.2 error code (``PROVIDER_RATE_LIMITED`` →
    ProviderError)."""
    for prefix, cls in _FAILURE_PREFIXES:
        if code.startswith(prefix):
            return cls(message or code, code=code)
    raise ValueError('not a contracts §5.2 error code: %r' % (code,))


def public_error_codes():
    """{HTTP status: sorted codes} of every error the API can answer with, read from the classes
    above; a 500 says only INTERNAL_ERROR (contracts §7.3). The OpenAPI document and the README
    are checked against it."""
    codes = {500: {'INTERNAL_ERROR'}}
    pending = [AiJobError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.http_status != 500:
            codes.setdefault(cls.http_status, set()).add(cls.code)
    return {status: sorted(codes[status]) for status in sorted(codes)}
