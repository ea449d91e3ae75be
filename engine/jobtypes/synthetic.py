"""The synthetic job type (contracts §2.3): offline and deterministic, driven by its
input so that tests and operators can exercise every path of the engine without an LLM. A
plugin like any other: its definition and its provider come in through ``register(app)``."""

from ..core.errors import failure_for_code
from ..core.registry import (
    CredentialPolicy,
    ExecutionPolicy,
    InputSpec,
    JobDefinition,
    Metadata,
    OutputSpec,
    QueuePolicy,
    RetryBackoff,
    SecurityPolicy,
)
from ..execution.providers import Provider, ProviderResult, Usage

FAIL_CODES = (
    'PROVIDER_TIMEOUT',
    'PROVIDER_RATE_LIMITED',
    'PROVIDER_UNAVAILABLE',
    'PROVIDER_ERROR',
    'VALIDATION_SCHEMA',
    'CONTENT_SAFETY_BLOCKED',
    'CREDENTIAL_INVALID',
    'INTERNAL_ERROR',
    'TIMEOUT',
)

SYNTHETIC_INPUT_SCHEMA = {
    'type': 'object',
    'properties': {
        'sleepMs': {'type': 'integer', 'minimum': 0, 'maximum': 600000},
        'failWith': {'type': 'string', 'enum': list(FAIL_CODES)},
        'failTimes': {'type': 'integer', 'minimum': 0},
        'progressSteps': {'type': 'integer', 'minimum': 0, 'maximum': 100},
        'output': {'type': 'object'},
    },
}


def synthetic_definition(
    job_type='synthetic',
    queue_name='ai-interactive',
    timeout_ms=30_000,
    max_retries=2,
    backoff_ms=500,
    abort_strategy='fail',
):
    """The synthetic definition; tests build variants (other queue, shorter backoff)."""
    return JobDefinition(
        job_type=job_type,
        metadata=Metadata(
            label='Synthetic job',
            domain='maintenance',
            version='1',
            description='Offline test job: sleeps, fails or echoes as its input says.',
        ),
        queue=QueuePolicy(queue_name=queue_name, default_priority=50),
        execution=ExecutionPolicy(
            timeout_ms=timeout_ms,
            max_retries=max_retries,
            retry_backoff=RetryBackoff(delay=backoff_ms),
            cancellable=True,
            abort_strategy=abort_strategy,
        ),
        input=InputSpec(schema_version='synthetic-input-v1', schema=SYNTHETIC_INPUT_SCHEMA),
        output=OutputSpec(schema_version='synthetic-output-v1', validator={'type': 'object'}),
        credential=CredentialPolicy(allowed_modes=('platform_key',), default_mode='platform_key'),
        projector=None,
        security=SecurityPolicy(content_safety_check=False),
        provider='synthetic',
    )


class SyntheticProvider(Provider):
    """Offline and deterministic; the job input drives it (README "Synthetic jobs"):
    ``sleepMs`` (honours deadline and cancellation), ``failWith`` + ``failTimes``,
    ``progressSteps``, ``output`` (default: echo the input)."""

    key = 'synthetic'
    model = 'synthetic-1'

    def generate(self, request, ctx):
        spec = request.input
        # JSON Schema's integers include 2.0, which range() refuses.
        steps = max(1, int(spec.get('progressSteps') or 1))
        sleep_s = (spec.get('sleepMs') or 0) / 1000.0
        for step in range(1, steps + 1):
            if sleep_s:
                ctx.sleep(sleep_s / steps)
            ctx.check()
            if spec.get('progressSteps'):
                ctx.report_progress(step * 100 // steps)
        code = spec.get('failWith')
        fail_times = spec.get('failTimes')
        if code and (fail_times is None or request.attempt <= fail_times):
            raise failure_for_code(
                code, 'synthetic failure %s (attempt %d)' % (code, request.attempt)
            )
        output = spec['output'] if 'output' in spec else dict(spec)
        return ProviderResult(
            output=output,
            usage=Usage(prompt_tokens=len(str(spec)) // 4, completion_tokens=len(str(output)) // 4),
            model=self.model,
        )


SYNTHETIC_JOB_DEFINITION = synthetic_definition()


def register(app):
    app.add_provider(SyntheticProvider())
    app.add_job_type(SYNTHETIC_JOB_DEFINITION)
