"""The prompt library: versioned templates, the generic fallback, the retry reminder."""

import pytest

from engine.core.errors import ProviderRequestError
from engine.execution.prompts import PromptLibrary, PromptTemplate, default_library
from engine.execution.providers import Credential, ProviderRequest
from engine.jobtypes.flashcards import FLASHCARD_JOB_DEFINITION, FLASHCARDS_V1

# ---------------------------------------------------------------- prompts
V2 = PromptTemplate(
    job_type='flashcard_generation', version='v2', system='S2 {schema}', user='cards from: {text}'
)


def request(prompt_version=None, attempt=1, job_type='flashcard_generation', input=None):
    return ProviderRequest(
        job_id='j',
        job_type=job_type,
        attempt=attempt,
        input=input or {'text': 'T {not a field}'},
        definition=FLASHCARD_JOB_DEFINITION,
        credential=Credential('x'),
        prompt_version=prompt_version,
    )


def test_the_latest_version_renders_by_default_and_an_older_one_on_request():
    library = PromptLibrary([FLASHCARDS_V1, V2])
    assert library.versions('flashcard_generation') == ['v1', 'v2']
    assert library.render(request())[1]['content'] == 'cards from: T {not a field}'
    assert 'at most 10 flashcards' in library.render(request('v1'))[1]['content']


def test_an_unknown_version_is_a_non_retryable_request_error():
    with pytest.raises(ProviderRequestError) as caught:
        PromptLibrary([FLASHCARDS_V1]).render(request('v7'))
    assert not caught.value.retryable and 'v7' in caught.value.public_message


def test_a_job_type_without_templates_uses_the_generic_one_with_its_schema():
    messages = default_library().render(request(job_type='summary', input={'a': 1}))
    assert '"cards"' in messages[0]['content']  # the definition's output schema
    assert messages[1]['content'] == 'Input (JSON):\n{"a": 1}'


def test_a_retry_adds_a_json_only_reminder():
    first = default_library().render(request())[0]['content']
    retry = default_library().render(request(attempt=2))[0]['content']
    assert 'JSON object only' in retry and 'JSON object only' not in first
