"""Jobs through the whole engine (outbox, queue, worker, provider, projector) against the loopback
OpenAI-compatible server: success, retries, failure classes, usage rows for every call, user keys,
cancellation, and no secret or job content in the logs."""

import base64
import logging
from decimal import Decimal

import pytest

from engine.core.errors import InvalidRequestError, PlatformUnavailableError
from engine.core.models import AiArtifact, AiJob, AiJobArtifact, AiUsageLog
from engine.core.registry import JobDefinitionRegistry
from engine.core.states import TERMINAL
from engine.jobtypes.flashcards import flashcard_definition
from engine.jobtypes.synthetic import synthetic_definition
from tests.support.fake_openai import Reply, error_reply, json_reply
from tests.support.helpers import create_job, wait_until
from tests.support.provider_configs import one_provider

CARDS = {
    'cards': [
        {'question': 'Capital of France?', 'answer': 'Paris'},
        {'question': 'Capital of Italy?', 'answer': 'Rome'},
    ]
}
TEXT = 'Paris is the capital of France; Rome is the capital of Italy.'
PLATFORM_KEY = 'sk-platform-e2e-5b0c9a77f1'
USER_KEY = 'sk-user-e2e-8d21c4f0aa93'
FAST = {
    'AIJOB_LOCK_TTL_MS': '1500',
    'AIJOB_HEARTBEAT_MS': '300',
    'AIJOB_REAP_AFTER_MS': '3000',
    'AIJOB_REAPER_INTERVAL_MS': '200',
    'AIJOB_OUTBOX_POLL_MS': '100',
    'AIJOB_SHUTDOWN_GRACE_MS': '3000',
}


def registry():
    reg = JobDefinitionRegistry()
    reg.register(synthetic_definition(backoff_ms=20))
    reg.register(flashcard_definition(timeout_ms=10_000, max_retries=2, backoff_ms=20))
    reg.register(flashcard_definition(job_type='flashcard_quick', timeout_ms=1000, max_retries=0))
    return reg


@pytest.fixture
def ai_runtime(make_runtime, fake):
    runtime = make_runtime(
        registry=registry(),
        AIJOB_PLATFORM_API_KEY=PLATFORM_KEY,
        AIJOB_CREDENTIAL_MASTER_KEY=base64.b64encode(b'm' * 32).decode(),
        **one_provider(fake.base_url, price={'prompt': '2', 'completion': '10', 'per': 1000}),
        AIJOB_CONTENT_SAFETY_PATTERNS='["forbidden topic"]',
        **FAST,
    )
    with runtime.store.connection():
        runtime.start_background()
        yield runtime
        runtime.stop_background(timeout_s=5)


def run_flashcards(ai_runtime, user_id='user-a', overrides=None, text=TEXT, timeout=20.0):
    job = create_job(
        ai_runtime,
        job_type='flashcard_generation',
        user_id=user_id,
        input={'text': text, 'maxCards': 5},
        overrides=overrides or {},
    )
    return wait_terminal(job.id, timeout)


def wait_terminal(job_id, timeout=20.0):
    def terminal():
        job = AiJob.get_by_id(job_id)
        return job if job.lifecycle_status in TERMINAL else None

    return wait_until(terminal, timeout=timeout)


def usage_rows(job):
    return list(AiUsageLog.select().where(AiUsageLog.job_id == job.id).order_by(AiUsageLog.id))


def test_a_flashcard_job_succeeds_with_one_artifact_per_card_and_a_priced_usage_row(
    ai_runtime, fake
):
    fake.script(json_reply(CARDS, chunks=5))
    job = run_flashcards(ai_runtime)
    assert job.lifecycle_status == 'succeeded' and job.output_hash
    links = (
        AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).order_by(AiJobArtifact.ordinal)
    )
    assert [(link.artifact_type, link.ordinal) for link in links] == [
        ('flashcard', 0),
        ('flashcard', 1),
    ]
    assert [AiArtifact.get_by_id(link.artifact_id).content for link in links] == CARDS['cards']
    [row] = usage_rows(job)
    assert (row.provider, row.model, row.attempt_no, row.credential_mode, row.error_code) == (
        'openai',
        'fake-model',
        1,
        'platform_key',
        None,
    )
    assert (row.prompt_tokens, row.completion_tokens) == (11, 7)
    assert Decimal(row.cost) == Decimal('0.092')  # (11 * 2 + 7 * 10) / 1000
    assert fake.requests[0]['_headers']['authorization'] == 'Bearer ' + PLATFORM_KEY


def test_invalid_json_then_valid_json_succeeds_on_the_retry(ai_runtime, fake):
    fake.script(Reply(content='Sure! Here are your cards.'), json_reply(CARDS))
    job = run_flashcards(ai_runtime)
    assert job.lifecycle_status == 'succeeded' and job.retry_count == 1
    assert [(r.attempt_no, r.call_no, r.error_code, r.prompt_tokens) for r in usage_rows(job)] == [
        (1, 1, 'VALIDATION_JSON', 11),
        (1, 2, None, 11),
    ]
    assert 'JSON object only' in fake.requests[1]['messages'][0]['content']


def test_output_that_fails_the_schema_is_retried(ai_runtime, fake):
    fake.script(json_reply({'cards': [{'question': 'no answer'}]}), json_reply(CARDS))
    job = run_flashcards(ai_runtime)
    assert job.lifecycle_status == 'succeeded'
    assert [r.error_code for r in usage_rows(job)] == ['VALIDATION_SCHEMA', None]


def test_rate_limiting_is_retried_and_logged(ai_runtime, fake):
    fake.script(error_reply(429, 'slow down', headers={'Retry-After': '0'}), json_reply(CARDS))
    job = run_flashcards(ai_runtime)
    assert job.lifecycle_status == 'succeeded'
    assert [r.error_code for r in usage_rows(job)] == ['PROVIDER_RATE_LIMITED', None]


def test_a_provider_error_that_persists_fails_after_every_retry_with_a_row_per_call(
    ai_runtime, fake
):
    fake.script(error_reply(500, 'boom'))
    job = run_flashcards(ai_runtime)
    assert (job.lifecycle_status, job.error_code) == ('failed', 'PROVIDER_ERROR')
    assert [(r.attempt_no, r.call_no, r.error_code) for r in usage_rows(job)] == [
        (1, 1, 'PROVIDER_ERROR'),
        (1, 2, 'PROVIDER_ERROR'),
        (1, 3, 'PROVIDER_ERROR'),
    ]


@pytest.mark.parametrize(
    'reply, code',
    [
        (error_reply(401, 'invalid api key'), 'CREDENTIAL_INVALID'),
        (Reply(content='', finish_reason='content_filter'), 'CONTENT_SAFETY_BLOCKED'),
        (
            error_reply(400, 'maximum context length exceeded', code='context_length_exceeded'),
            'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH',
        ),
    ],
)
def test_non_retryable_failures_fail_after_one_call(ai_runtime, fake, reply, code):
    fake.script(reply)
    job = run_flashcards(ai_runtime)
    assert (job.lifecycle_status, job.error_code) == ('failed', code)
    assert [r.error_code for r in usage_rows(job)] == [code]
    assert len(fake.requests) == 1


def test_unsafe_input_fails_before_any_provider_call(ai_runtime, fake):
    job = run_flashcards(ai_runtime, text='Tell me about the Forbidden Topic.')
    assert (job.lifecycle_status, job.error_code) == ('failed', 'CONTENT_SAFETY_BLOCKED')
    assert fake.requests == []


def test_unsafe_output_fails_without_retry(ai_runtime, fake):
    fake.script(json_reply({'cards': [{'question': 'q', 'answer': 'the forbidden topic'}]}))
    job = run_flashcards(ai_runtime)
    assert (job.lifecycle_status, job.error_code) == ('failed', 'CONTENT_SAFETY_BLOCKED')
    assert len(fake.requests) == 1


def test_cancelling_a_slow_stream_ends_cancelled_and_closes_the_upstream(ai_runtime, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=0.1))
    job = create_job(ai_runtime, job_type='flashcard_generation', input={'text': TEXT})
    wait_until(lambda: fake.requests, timeout=10)
    ai_runtime.service.cancel_job(job.id)
    job = wait_terminal(job.id, timeout=5)
    assert job.lifecycle_status == 'cancelled'
    assert fake.client_closed.wait(3)
    assert [r.error_code for r in usage_rows(job)] == ['CANCELLED']


@pytest.mark.slow
def test_a_stream_still_running_at_the_job_deadline_ends_timeout(ai_runtime, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=0.1))
    job = create_job(ai_runtime, job_type='flashcard_quick', input={'text': TEXT})
    job = wait_terminal(job.id, timeout=10)
    assert (job.lifecycle_status, job.error_code) == ('failed', 'TIMEOUT')
    assert fake.client_closed.wait(3)
    assert [r.error_code for r in usage_rows(job)] == ['TIMEOUT']


def test_a_jobs_prompt_version_selects_its_template(ai_runtime, fake):
    fake.script(json_reply(CARDS))
    assert (
        run_flashcards(ai_runtime, overrides={'promptVersion': 'v1'}).lifecycle_status
        == 'succeeded'
    )
    assert 'at most 5 flashcards' in fake.requests[0]['messages'][-1]['content']
    with pytest.raises(InvalidRequestError) as refused:  # refused before anything is written
        create_job(
            ai_runtime,
            job_type='flashcard_generation',
            input={'text': TEXT},
            overrides={'promptVersion': 'v9'},
        )
    assert refused.value.field == 'overrides.promptVersion'
    assert len(fake.requests) == 1


def test_a_user_key_job_for_an_unconfigured_provider_is_refused_at_creation(make_runtime):
    ai_runtime = make_runtime()  # no provider base URL configured
    with pytest.raises(PlatformUnavailableError):
        create_job(
            ai_runtime,
            job_type='flashcard_generation',
            input={'text': TEXT},
            overrides={'credentialMode': 'user_deepseek_key', 'credentialId': 'c-1'},
        )


def test_a_user_key_job_calls_with_the_owners_key(ai_runtime, fake):
    fake.script(json_reply(CARDS))
    credential = ai_runtime.ai.credential_store.register('user-a', 'deepseek', USER_KEY)
    job = run_flashcards(
        ai_runtime, overrides={'credentialMode': 'user_deepseek_key', 'credentialId': credential.id}
    )
    assert job.lifecycle_status == 'succeeded'
    assert fake.requests[0]['_headers']['authorization'] == 'Bearer ' + USER_KEY
    assert usage_rows(job)[0].credential_mode == 'user_deepseek_key'


def test_another_users_credential_fails_the_job_without_a_call(ai_runtime, fake):
    credential = ai_runtime.ai.credential_store.register('user-a', 'deepseek', USER_KEY)
    job = run_flashcards(
        ai_runtime,
        user_id='user-b',
        overrides={'credentialMode': 'user_deepseek_key', 'credentialId': credential.id},
    )
    assert (job.lifecycle_status, job.error_code) == ('failed', 'CREDENTIAL_NOT_FOUND')
    assert fake.requests == []


def test_keys_and_job_content_never_reach_the_logs(ai_runtime, fake, caplog, capfd):
    # peewee's DEBUG echoes every SQL parameter (the snapshot's input too) by design; production
    # must not run it at DEBUG (README), so it is held at INFO here. Set first: each call also
    # sets the capture handler's level, and the last one must be DEBUG.
    caplog.set_level(logging.INFO, logger='peewee')
    caplog.set_level(logging.DEBUG)  # aijob and every library at DEBUG
    fake.script(Reply(content='not json'), json_reply(CARDS))
    credential = ai_runtime.ai.credential_store.register('user-a', 'deepseek', USER_KEY)
    assert run_flashcards(ai_runtime).lifecycle_status == 'succeeded'
    fake.script(error_reply(401, 'invalid api key'))
    run_flashcards(
        ai_runtime, overrides={'credentialMode': 'user_deepseek_key', 'credentialId': credential.id}
    )
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    # Captured, at DEBUG: the chat call's transport (http_stream.py) logs nothing of its own.
    assert caplog.handler.level == logging.DEBUG
    assert any(r.name == 'aijob' for r in caplog.records)
    for secret in (PLATFORM_KEY, USER_KEY, TEXT, 'Capital of France'):
        assert secret not in logged
