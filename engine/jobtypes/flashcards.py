"""The ``flashcard_generation`` job type: study flashcards from a text, written by an
OpenAI-compatible model, projected as one ``flashcard`` artifact per card."""

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
from ..execution.projectors import ProjectionResult, ResultProjector, store_json_artifact
from ..execution.prompts import PromptTemplate

MAX_CARDS = 50
MAX_TEXT_CHARS = 50_000

FLASHCARD_INPUT_SCHEMA = {
    'type': 'object',
    'properties': {
        'text': {'type': 'string', 'minLength': 1, 'maxLength': MAX_TEXT_CHARS, 'pattern': r'\S'},
        'maxCards': {'type': 'integer', 'minimum': 1, 'maximum': MAX_CARDS},
    },
    'required': ['text'],
    'additionalProperties': False,
}

FLASHCARD_OUTPUT_SCHEMA = {
    'type': 'object',
    'properties': {
        'cards': {
            'type': 'array',
            'minItems': 1,
            'maxItems': MAX_CARDS,
            'items': {
                'type': 'object',
                'properties': {
                    'question': {'type': 'string', 'minLength': 1},
                    'answer': {'type': 'string', 'minLength': 1},
                },
                'required': ['question', 'answer'],
            },
        },
    },
    'required': ['cards'],
}


class FlashcardProjector(ResultProjector):
    """One ``flashcard`` artifact per card, its position in the output as ordinal. Idempotent:
    ``store_json_artifact`` returns the existing artifact for a (job, type, ordinal)."""

    key = 'flashcards'

    def project(self, tx, job, validated_output):
        refs = [
            store_json_artifact(
                tx,
                job,
                'flashcard',
                {'question': card['question'], 'answer': card['answer']},
                ordinal=ordinal,
            )
            for ordinal, card in enumerate(validated_output['cards'])
        ]
        return ProjectionResult(refs)


def flashcard_definition(
    job_type='flashcard_generation',
    provider='openai',
    timeout_ms=120_000,
    max_retries=2,
    backoff_ms=2000,
):
    """The definition; tests build variants (shorter timeout, faster backoff)."""
    return JobDefinition(
        job_type=job_type,
        metadata=Metadata(
            label='Flashcards',
            domain='generation',
            version='1',
            description='Question/answer study cards from a text.',
        ),
        queue=QueuePolicy(queue_name='ai-interactive', default_priority=40),
        execution=ExecutionPolicy(
            timeout_ms=timeout_ms,
            max_retries=max_retries,
            retry_backoff=RetryBackoff(delay=backoff_ms),
            cancellable=True,
            abort_strategy='fail',
        ),
        input=InputSpec(schema_version='flashcard-input-v1', schema=FLASHCARD_INPUT_SCHEMA),
        output=OutputSpec(schema_version='flashcard-output-v1', validator=FLASHCARD_OUTPUT_SCHEMA),
        credential=CredentialPolicy(
            allowed_modes=('platform_key', 'user_deepseek_key'), default_mode='platform_key'
        ),
        projector=FlashcardProjector.key,
        security=SecurityPolicy(content_safety_check=True),
        provider=provider,
    )


FLASHCARD_JOB_DEFINITION = flashcard_definition()

FLASHCARDS_V1 = PromptTemplate(
    job_type='flashcard_generation',
    version='v1',
    system=(
        'You write study flashcards. Reply with one JSON object, and nothing else, that '
        'validates against this JSON Schema: {schema}'
    ),
    user=(
        'Write at most {maxCards} flashcards that test the key facts of the text below. Each '
        'card has a short question and a precise answer taken from the text.\n\n'
        'Text:\n{text}'
    ),
    defaults=(('maxCards', 10),),
)


def register(app):
    """The definition, its projector and its prompt; the OpenAI-compatible provider it runs on
    is the gateway's, when AIJOB_PROVIDERS or AIJOB_PROVIDER_BASE_URL configures one."""
    app.add_projector(FlashcardProjector())
    app.add_prompt(FLASHCARDS_V1)
    app.add_job_type(FLASHCARD_JOB_DEFINITION)
