"""The flashcard_generation job type (definition, availability, projector) and usage totals."""

import datetime
from decimal import Decimal

import pytest

from engine.core.errors import InvalidInputError, PlatformUnavailableError
from engine.core.models import AiArtifact, AiJobArtifact
from engine.execution.providers import Usage
from engine.execution.usage import record_usage, usage_totals
from engine.jobtypes.flashcards import FlashcardProjector
from tests.helpers import create_job

CONFIGURED = {
    'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:9/v1',
    'AIJOB_PLATFORM_API_KEY': 'sk-platform-0000000000',
}
CARDS = {
    'cards': [
        {'question': 'Q1', 'answer': 'A1'},
        {'question': 'Q2', 'answer': 'A2'},
        {'question': 'Q3', 'answer': 'A3'},
    ]
}


@pytest.fixture
def rt(make_runtime):
    runtime = make_runtime(**CONFIGURED)
    with runtime.store.connection():
        yield runtime


def flashcard_job(rt, **kw):
    return create_job(rt, job_type='flashcard_generation', input={'text': 'Some text.'}, **kw)


# ---------------------------------------------------------------- definition and availability
def test_flashcard_generation_is_registered_by_default(rt):
    definition = rt.registry.get('flashcard_generation')
    assert definition.queue.queue_name == 'ai-interactive'
    assert definition.security.content_safety_check
    assert set(definition.credential.allowed_modes) == {'platform_key', 'user_deepseek_key'}
    assert rt.ai.projectors.for_definition(definition).key == 'flashcards'


@pytest.mark.parametrize(
    'input',
    [
        {'text': ''},
        {'text': '   '},
        {'maxCards': 3},
        {'text': 'x', 'maxCards': 0},
        {'text': 'x', 'maxCards': 51},
        {'text': 'x', 'extra': 1},
    ],
)
def test_flashcard_input_is_validated_at_creation(rt, input):
    with pytest.raises(InvalidInputError):
        create_job(rt, job_type='flashcard_generation', input=input)


@pytest.mark.parametrize('settings', [{}, {'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:9/v1'}])
def test_without_a_provider_and_platform_key_flashcards_are_unavailable(make_runtime, settings):
    runtime = make_runtime(**settings)
    with runtime.store.connection():
        with pytest.raises(PlatformUnavailableError):
            flashcard_job(runtime)
        assert create_job(runtime, job_type='synthetic').lifecycle_status == 'queued'


# ---------------------------------------------------------------- projector
def project(rt, job, output):
    return rt.store.run_in_transaction(lambda tx: FlashcardProjector().project(tx, job, output))


def test_the_projector_writes_one_artifact_per_card_with_its_ordinal(rt):
    job = flashcard_job(rt)
    refs = project(rt, job, CARDS).artifacts
    assert [(r.artifact_type, r.ordinal) for r in refs] == [
        ('flashcard', 0),
        ('flashcard', 1),
        ('flashcard', 2),
    ]
    links = (
        AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).order_by(AiJobArtifact.ordinal)
    )
    contents = [AiArtifact.get_by_id(link.artifact_id).content for link in links]
    assert contents == CARDS['cards']


def test_projecting_twice_is_idempotent(rt):
    job = flashcard_job(rt)
    first = project(rt, job, CARDS).artifacts
    second = project(rt, job, CARDS).artifacts
    assert first == second
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 3
    assert AiArtifact.select().where(AiArtifact.job_id == job.id).count() == 3


# ---------------------------------------------------------------- usage totals
def test_usage_totals_per_user_and_per_job_type_count_calls_tokens_cost_and_errors(rt):
    job_a = flashcard_job(rt, user_id='user-a')
    job_b = create_job(rt, job_type='synthetic', user_id='user-b')
    record_usage(
        job_a,
        1,
        'openai',
        'deepseek-chat',
        Usage(100, 20),
        Decimal('0.000049'),
        900,
        'VALIDATION_JSON',
    )
    record_usage(job_a, 2, 'openai', 'deepseek-chat', Usage(120, 40), Decimal('0.000076'), 800)
    record_usage(job_b, 1, 'synthetic', 'synthetic-1', Usage(5, 5), Decimal('0'), 3)
    since = rt.store.clock() - datetime.timedelta(hours=1)
    until = rt.store.clock() + datetime.timedelta(hours=1)
    assert usage_totals(since, until, 'user') == [
        {
            'userId': 'user-a',
            'calls': 2,
            'promptTokens': 220,
            'completionTokens': 60,
            'cost': '0.000125',
            'errors': 1,
        },
        {
            'userId': 'user-b',
            'calls': 1,
            'promptTokens': 5,
            'completionTokens': 5,
            'cost': '0.000000',
            'errors': 0,
        },
    ]
    by_type = usage_totals(since, until, 'job_type')
    assert [(t['jobType'], t['calls']) for t in by_type] == [
        ('flashcard_generation', 2),
        ('synthetic', 1),
    ]


def test_usage_outside_the_range_is_not_counted(rt):
    job = flashcard_job(rt)
    record_usage(job, 1, 'openai', 'm', Usage(1, 1), Decimal('1'), 1)
    later = rt.store.clock() + datetime.timedelta(minutes=5)
    assert usage_totals(later, later + datetime.timedelta(hours=1), 'user') == []


def test_usage_totals_reject_an_unknown_grouping(rt):
    with pytest.raises(ValueError):
        usage_totals(datetime.datetime(2020, 1, 1), datetime.datetime(2030, 1, 1), 'model')
