"""The full job lifecycle through HTTP with the engine running in this process: create → poll →
succeeded → artifacts, cancel queued and running, failure details by role, admin retry."""

import pytest

from engine.core.models import AiJob
from tests.support.api import ADMIN_JOBS, JOBS, job_body, poll_until


def test_create_poll_succeed_and_read_the_artifacts(live_api):
    output = {'summary': 'done', 'items': [1, 2, 3]}
    created = live_api.a.post(
        JOBS, job_body(input={'sleepMs': 50, 'progressSteps': 2, 'output': output})
    )
    assert created.status == 201
    job_id = created.json['jobId']
    status = poll_until(live_api.a, job_id, {'succeeded', 'failed'})
    assert status['lifecycleStatus'] == 'succeeded' and status['progress'] == 100
    assert status['startedAt'] and status['finishedAt']
    assert status['result']['artifactCount'] == 1
    ref = status['result']['artifacts'][0]
    artifacts = live_api.a.get(JOBS + '/%s/artifacts' % job_id).json
    assert artifacts['artifacts'] == [
        {
            'artifactType': ref['artifactType'],
            'artifactId': ref['artifactId'],
            'ordinal': 0,
            'content': output,
        }
    ]
    assert live_api.b.get(JOBS + '/%s/artifacts' % job_id).status == 404


@pytest.mark.slow
def test_cancel_a_job_still_queued_behind_a_busy_worker(live_api):
    # ai-background runs one job at a time: the second waits in the queue.
    busy = live_api.a.post(JOBS, job_body(jobType='synthetic_bg', input={'sleepMs': 1500})).json
    poll_until(live_api.a, busy['jobId'], {'running'})
    waiting = live_api.a.post(JOBS, job_body(jobType='synthetic_bg')).json
    response = live_api.a.post(JOBS + '/%s/cancel' % waiting['jobId'])
    assert response.status == 200 and response.json['lifecycleStatus'] == 'cancelled'
    assert poll_until(live_api.a, busy['jobId'], {'succeeded'})['lifecycleStatus'] == 'succeeded'
    assert AiJob.get_by_id(waiting['jobId']).started_at is None  # it never ran


def test_cancel_a_running_job(live_api):
    job_id = live_api.a.post(JOBS, job_body(input={'sleepMs': 10000})).json['jobId']
    poll_until(live_api.a, job_id, {'running'})
    response = live_api.a.post(JOBS + '/%s/cancel' % job_id)
    assert response.status == 202 and response.json['lifecycleStatus'] == 'running'
    final = poll_until(live_api.a, job_id, {'cancelled', 'succeeded', 'failed'}, timeout_s=8)
    assert final['lifecycleStatus'] == 'cancelled' and final['errorCode'] == 'CANCELLED'
    again = live_api.a.post(JOBS + '/%s/cancel' % job_id)
    assert again.status == 409 and again.error_code == 'JOB_ALREADY_CANCELLED'


def test_a_failed_job_shows_public_details_to_users_and_internals_to_admins_then_retries(live_api):
    job_id = live_api.a.post(JOBS, job_body(input={'failWith': 'CONTENT_SAFETY_BLOCKED'})).json[
        'jobId'
    ]
    failed = poll_until(live_api.a, job_id, {'failed', 'succeeded'})
    assert failed['lifecycleStatus'] == 'failed' and failed['errorCode'] == 'CONTENT_SAFETY_BLOCKED'
    assert failed['publicErrorMessage'] and 'internalErrorMessage' not in failed
    assert live_api.a.post(JOBS + '/%s/cancel' % job_id).error_code == 'JOB_NOT_CANCELLABLE'
    listed = live_api.admin.get(ADMIN_JOBS, query={'lifecycleStatus': 'failed'}).json['items']
    assert [item['jobId'] for item in listed] == [job_id]
    assert listed[0]['internalErrorMessage']

    retried = live_api.admin.post(ADMIN_JOBS + '/%s/retry' % job_id)
    assert retried.status == 201 and retried.json['retryOfJobId'] == job_id
    again = poll_until(live_api.a, retried.json['jobId'], {'failed', 'succeeded'})
    assert again['errorCode'] == 'CONTENT_SAFETY_BLOCKED'  # same input, same outcome
