"""An example job-type plugin: ``summarize`` turns a text into a short summary, written by the
OpenAI-compatible provider and kept in a table of the plugin's own (``example_summary``).

Load it as any plugin is loaded::

    AIJOB_DEFINITIONS=examples.summarize AIJOB_PROVIDER_BASE_URL=https://api.deepseek.com \\
    AIJOB_PLATFORM_API_KEY=sk-... python aijob.py serve

then ``POST /api/ai/jobs`` with ``{"jobType": "summarize", "targetType": "note", "targetId":
"n1", "input": {"text": "...", "maxWords": 40}}``. The job's artifact is a link to its row in
``example_summary``, which the application reads directly.
"""

from peewee import CharField, IntegerField, TextField

from engine.core.models import BaseModel, Timestamp, new_id
from engine.core.registry import (
    CredentialPolicy,
    ExecutionPolicy,
    InputSpec,
    JobDefinition,
    Metadata,
    OutputSpec,
    QueuePolicy,
    RetryBackoff,
)
from engine.core.store import db_now
from engine.execution.projectors import (
    ArtifactRef,
    ProjectionResult,
    ResultProjector,
    link_artifact,
)
from engine.execution.prompts import PromptTemplate


class Summary(BaseModel):
    """One summary per job: the plugin's own table, created by ``python aijob.py initdb``."""

    id = CharField(max_length=36, primary_key=True)
    job_id = CharField(max_length=36, unique=True)
    target_id = CharField(max_length=128)
    summary = TextField()
    word_count = IntegerField()
    created_at = Timestamp()

    class Meta:
        table_name = 'example_summary'


INPUT_SCHEMA = {
    'type': 'object',
    'properties': {
        'text': {'type': 'string', 'minLength': 1, 'maxLength': 50_000, 'pattern': r'\S'},
        'maxWords': {'type': 'integer', 'minimum': 5, 'maximum': 500},
    },
    'required': ['text'],
    'additionalProperties': False,
}

OUTPUT_SCHEMA = {
    'type': 'object',
    'properties': {'summary': {'type': 'string', 'minLength': 1}},
    'required': ['summary'],
}

SUMMARIZE = JobDefinition(
    job_type='summarize',
    metadata=Metadata(
        label='Summary',
        domain='generation',
        version='1',
        description='A short summary of a text.',
    ),
    queue=QueuePolicy(queue_name='ai-interactive', default_priority=50),
    execution=ExecutionPolicy(
        timeout_ms=60_000, max_retries=2, retry_backoff=RetryBackoff(delay=1000)
    ),
    input=InputSpec(schema_version='summarize-input-v1', schema=INPUT_SCHEMA),
    output=OutputSpec(schema_version='summarize-output-v1', validator=OUTPUT_SCHEMA),
    credential=CredentialPolicy(allowed_modes=('platform_key',), default_mode='platform_key'),
    projector='summaries',
    provider='openai',
)

PROMPT_V1 = PromptTemplate(
    job_type='summarize',
    version='v1',
    system=(
        'You summarise texts. Reply with one JSON object, and nothing else, that validates '
        'against this JSON Schema: {schema}'
    ),
    user='Summarise the text below in at most {maxWords} words.\n\nText:\n{text}',
    defaults=(('maxWords', 60),),
)


class SummaryProjector(ResultProjector):
    """Writes the summary row in the transaction that marks the job succeeded; projecting the
    same job twice returns the row already written (projectors must be idempotent)."""

    key = 'summaries'

    def project(self, tx, job, validated_output):
        existing = Summary.get_or_none(Summary.job_id == job.id)
        if existing is None:
            text = validated_output['summary'].strip()
            existing = Summary.create(
                id=new_id(),
                job_id=job.id,
                target_id=job.target_id,
                summary=text,
                word_count=len(text.split()),
                created_at=db_now(),
            )
        ref = link_artifact(tx, job, ArtifactRef('summary', existing.id))
        return ProjectionResult([ref])


def register(app):
    """The plugin entry point, named in AIJOB_DEFINITIONS."""
    app.add_models(Summary)
    app.add_projector(SummaryProjector())
    app.add_prompt(PROMPT_V1)
    app.add_job_type(SUMMARIZE)
