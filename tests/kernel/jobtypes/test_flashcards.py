"""The flashcard_generation job type: definition, availability, projector."""

import pytest

from engine.core.errors import InvalidInputError, PlatformUnavailableError
from engine.core.models import AiArtifact, AiJobArtifact
from engine.jobtypes.flashcards import FlashcardProjector
from tests.support.helpers import create_job

CARDS = {
    'cards': [
        {'question': 'Q1', 'answer': 'A1'},
        {'question': 'Q2', 'answer': 'A2'},
        {'question': 'Q3', 'answer': 'A3'},
    ]
}


def flashcard_job(rt, **kw):
    return create_job(rt, job_type='flashcard_generation', input={'text': 'Some text.'}, **kw)


# ---------------------------------------------------------------- definition and availability
def test_flashcard_generation_is_registered_by_default(provider_runtime):
    definition = provider_runtime.registry.get('flashcard_generation')
    assert definition.queue.queue_name == 'ai-interactive'
    assert definition.security.content_safety_check
    assert set(definition.credential.allowed_modes) == {'platform_key', 'user_deepseek_key'}
    assert provider_runtime.ai.projectors.for_definition(definition).key == 'flashcards'


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
def test_flashcard_input_is_validated_at_creation(provider_runtime, input):
    with pytest.raises(InvalidInputError):
        create_job(provider_runtime, job_type='flashcard_generation', input=input)


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


def test_the_projector_writes_one_artifact_per_card_with_its_ordinal(provider_runtime):
    job = flashcard_job(provider_runtime)
    refs = project(provider_runtime, job, CARDS).artifacts
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


def test_projecting_twice_is_idempotent(provider_runtime):
    job = flashcard_job(provider_runtime)
    first = project(provider_runtime, job, CARDS).artifacts
    second = project(provider_runtime, job, CARDS).artifacts
    assert first == second
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 3
    assert AiArtifact.select().where(AiArtifact.job_id == job.id).count() == 3
