"""The execution engine end to end (contracts §5, §6): jobs created through AiJobService run to a
terminal state by themselves, on both backend pairs."""

import dataclasses
import json
import time

import pytest

from engine.core.logs import JsonFormatter
from engine.core.models import AiArtifact, AiJob, AiJobArtifact, AiUsageLog
from engine.execution.projectors import ProjectionResult, ResultProjector, store_json_artifact
from engine.jobtypes.synthetic import SyntheticProvider, synthetic_definition
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import fast_registry, run_job, wait_terminal

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def usage_rows(job_id):
    return list(AiUsageLog.select().where(AiUsageLog.job_id == job_id).order_by(AiUsageLog.id))


def test_a_job_succeeds_with_its_artifact_and_usage_row(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, output={'answer': 42, 'nested': {'b': 1, 'a': 2}})
    assert (job.lifecycle_status, job.progress, job.error_code) == ('succeeded', 100, None)
    assert job.started_at and job.finished_at and job.output_hash
    links = list(AiJobArtifact.select().where(AiJobArtifact.job_id == job.id))
    assert [(link.artifact_type, link.ordinal) for link in links] == [('json', 0)]
    assert AiArtifact.get_by_id(links[0].artifact_id).content == {
        'answer': 42,
        'nested': {'b': 1, 'a': 2},
    }
    [usage] = usage_rows(job.id)
    assert (usage.attempt_no, usage.error_code, usage.provider, usage.credential_mode) == (
        1,
        None,
        'synthetic',
        'platform_key',
    )


def test_the_output_hash_is_canonical_at_every_depth(engine_rt):
    engine_rt.start_background()
    first = run_job(engine_rt, output={'a': {'x': 1, 'y': 2}, 'b': 1})
    second = run_job(engine_rt, output={'b': 1, 'a': {'y': 2, 'x': 1}})
    third = run_job(engine_rt, output={'b': 1, 'a': {'y': 2, 'x': 2}})
    assert first.output_hash == second.output_hash != third.output_hash


def test_progress_reaches_one_hundred_through_steps(engine_rt):
    engine_rt.start_background()
    job = create_job(engine_rt, input={'sleepMs': 600, 'progressSteps': 4})
    seen = wait_until(
        lambda: (
            AiJob.get_by_id(job.id).progress in (25, 50, 75) and AiJob.get_by_id(job.id).progress
        )
    )
    assert seen in (25, 50, 75)
    assert wait_terminal(engine_rt, job.id).progress == 100


def test_a_step_count_written_as_a_whole_float_is_an_integer(engine_rt):
    """JSON Schema counts 2.0 as an integer, so the input schema admits it: the job runs (the
    contract run's fuzzing once made such a job fail with an internal provider error)."""
    engine_rt.start_background()
    job = create_job(engine_rt, input={'progressSteps': 2.0})
    done = wait_terminal(engine_rt, job.id)
    assert (done.lifecycle_status, done.progress) == ('succeeded', 100)


def test_a_retryable_error_fails_after_the_retries_are_used(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith='PROVIDER_UNAVAILABLE')
    assert (job.lifecycle_status, job.error_code, job.retry_count) == (
        'failed',
        'PROVIDER_UNAVAILABLE',
        2,
    )
    assert job.public_error_message and 'synthetic failure' not in job.public_error_message
    assert 'synthetic failure' in job.internal_error_message
    # One attempt (one lock), three calls within it.
    assert [(u.attempt_no, u.call_no, u.error_code) for u in usage_rows(job.id)] == [
        (1, 1, 'PROVIDER_UNAVAILABLE'),
        (1, 2, 'PROVIDER_UNAVAILABLE'),
        (1, 3, 'PROVIDER_UNAVAILABLE'),
    ]


def test_a_retryable_error_that_clears_succeeds(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith='PROVIDER_RATE_LIMITED', failTimes=2)
    assert (job.lifecycle_status, job.retry_count) == ('succeeded', 2)
    assert [u.error_code for u in usage_rows(job.id)] == ['PROVIDER_RATE_LIMITED'] * 2 + [None]


@pytest.mark.parametrize('code', ['CONTENT_SAFETY_BLOCKED', 'CREDENTIAL_INVALID'])
def test_a_non_retryable_error_fails_at_once(engine_rt, code):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith=code, failTimes=1)
    assert (job.lifecycle_status, job.error_code, job.retry_count) == ('failed', code, 0)
    assert len(usage_rows(job.id)) == 1


def test_internal_errors_are_retried_at_most_once(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith='INTERNAL_ERROR')
    assert (job.lifecycle_status, job.error_code, job.retry_count) == (
        'failed',
        'INTERNAL_ERROR',
        1,
    )


def test_a_provider_that_raises_unexpectedly_is_logged_by_class_and_place_not_content(
    engine_rt, monkeypatch, caplog
):
    """An exception no provider should raise becomes INTERNAL_PROVIDER_ERROR; the log says
    which class and where (to find the bug), never its message (it may quote the input)."""

    def broken(self, request, ctx):
        raise RuntimeError('SECRET-%s' % request.input['secret'])

    monkeypatch.setattr(SyntheticProvider, 'generate', broken)
    engine_rt.start_background()
    job = run_job(engine_rt, secret='from-the-input')
    assert (job.lifecycle_status, job.error_code) == ('failed', 'INTERNAL_PROVIDER_ERROR')
    records = [r for r in caplog.records if r.getMessage() == 'job.provider_internal_error']
    logged = [json.loads(JsonFormatter().format(record)) for record in records]
    assert logged and logged[0]['error_type'] == 'RuntimeError'
    assert any('test_execution.py' in frame and 'broken' in frame for frame in logged[0]['stack'])
    assert 'SECRET' not in json.dumps(logged) and 'from-the-input' not in json.dumps(logged)


def test_validation_errors_are_retried(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith='VALIDATION_SCHEMA', failTimes=1)
    assert (job.lifecycle_status, job.retry_count) == ('succeeded', 1)


@pytest.mark.slow
def test_a_job_past_its_timeout_ends_timeout(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, job_type='synthetic_short', sleepMs=300_000)  # 1 s timeout
    assert (job.lifecycle_status, job.error_code, job.retry_count) == ('failed', 'TIMEOUT', 0)


@pytest.mark.slow
def test_abort_strategy_retry_retries_a_timeout(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, job_type='synthetic_short_retry', sleepMs=300_000)
    assert (job.lifecycle_status, job.error_code, job.retry_count) == ('failed', 'TIMEOUT', 1)


def test_cancel_while_queued(engine_rt):
    job = create_job(engine_rt, input={})
    cancelled = engine_rt.service.cancel_job(job.id)
    assert (cancelled.lifecycle_status, cancelled.error_code) == ('cancelled', 'CANCELLED')
    engine_rt.start_background()
    time.sleep(0.5)  # the message is consumed, nothing runs
    assert AiJob.get_by_id(job.id).lifecycle_status == 'cancelled' and usage_rows(job.id) == []


def test_cancel_while_running_ends_cancelled_never_succeeded(engine_rt):
    engine_rt.start_background()
    job = create_job(engine_rt, input={'sleepMs': 300_000})  # ends only if the cancel stops it
    wait_until(lambda: AiJob.get_by_id(job.id).lifecycle_status == 'running')
    assert engine_rt.service.cancel_job(job.id).lifecycle_status == 'running'
    done = wait_terminal(engine_rt, job.id)
    assert (done.lifecycle_status, done.error_code) == ('cancelled', 'CANCELLED')
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 0


def test_cancel_during_backoff_stops_the_retries(make_engine_rt):
    engine_rt = make_engine_rt(synthetic_definition(backoff_ms=5000))
    engine_rt.start_background()
    job = create_job(engine_rt, input={'failWith': 'PROVIDER_UNAVAILABLE'})
    wait_until(lambda: len(usage_rows(job.id)) == 1)
    engine_rt.service.cancel_job(job.id)
    done = wait_terminal(engine_rt, job.id, timeout=3)
    assert done.lifecycle_status == 'cancelled' and len(usage_rows(job.id)) == 1


def test_background_queue_jobs_run_too(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, job_type='synthetic_bg')
    assert (job.lifecycle_status, job.queue_name) == ('succeeded', 'ai-background')


class FlakyProjector(ResultProjector):
    """Writes its artifact, then fails the first time: the transaction must roll back."""

    key = 'flaky'

    def __init__(self):
        self.calls = 0

    def project(self, tx, job, validated_output):
        self.calls += 1
        ref = store_json_artifact(tx, job, 'json', validated_output)
        if self.calls == 1:
            raise RuntimeError('projector failure')
        return ProjectionResult([ref])


def test_a_projector_failure_rolls_back_and_the_job_retries(make_engine_rt):
    synthetic = fast_registry().get('synthetic')
    engine_rt = make_engine_rt(dataclasses.replace(synthetic, projector='flaky'))
    projector = FlakyProjector()
    engine_rt.ai.projectors.add(projector)
    engine_rt.start_background()
    job = run_job(engine_rt, output={'v': 1})
    assert (job.lifecycle_status, job.retry_count, projector.calls) == ('succeeded', 1, 2)
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 1
    assert AiArtifact.select().where(AiArtifact.job_id == job.id).count() == 1
    assert [u.error_code for u in usage_rows(job.id)] == ['INTERNAL_PROJECTION_FAILED', None]


def test_a_duplicate_projection_is_idempotent(engine_rt):
    job = create_job(engine_rt)
    projector = engine_rt.ai.projectors.for_definition(engine_rt.registry.get('synthetic'))
    with engine_rt.store.atomic() as tx:
        first = projector.project(tx, job, {'v': 1})
    with engine_rt.store.atomic() as tx:
        second = projector.project(tx, job, {'v': 1})
    assert first.artifacts == second.artifacts
    assert AiJobArtifact.select().where(AiJobArtifact.job_id == job.id).count() == 1


def test_a_projector_missing_in_this_process_fails_the_job_at_once(make_engine_rt):
    synthetic = fast_registry().get('synthetic')
    engine_rt = make_engine_rt(dataclasses.replace(synthetic, projector='not_here'))
    engine_rt.start_background()
    job = run_job(engine_rt)
    assert (job.lifecycle_status, job.error_code, job.retry_count) == (
        'failed',
        'INTERNAL_PROJECTOR_MISSING',
        0,
    )
    assert usage_rows(job.id) == []  # nothing was called
