"""GET /api/ai/jobs/{id}/events: a job's transition history over HTTP (WSGI in-process, checked
against /openapi.json): the owner's view, the admin's, paging, 404 for others, 400 for bad
parameters."""

import pytest

from engine.core.models import AiJobEvent
from tests.support.api import JOBS, run_to_failed
from tests.support.helpers import wait_until

SECRET = 'provider said 500 at https://internal.example/v1'


def events_path(job_id):
    return '%s/%s/events' % (JOBS, job_id)


def test_the_owner_sees_the_history_without_workers_or_internal_messages(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id, internal=SECRET)
    response = api.a.get(events_path(job_id))
    assert response.status == 200
    body = response.json
    assert (body['jobId'], body['lifecycleStatus'], body['nextAfter']) == (job_id, 'failed', None)
    kinds = [e['kind'] for e in body['events'] if e['kind'] != 'dispatched']
    assert kinds == ['created', 'started', 'failed']
    assert [e['id'] for e in body['events']] == sorted(e['id'] for e in body['events'])
    failed = body['events'][-1]
    assert failed['attemptNo'] == 1 and failed['at'].endswith('Z')
    assert failed['detail'] == {
        'errorCode': 'PROVIDER_UNAVAILABLE',
        'message': 'The AI provider is unavailable.',
    }
    assert SECRET.encode() not in response.body and b'test-worker' not in response.body


def test_an_admin_sees_everything(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id, internal=SECRET)
    body = api.admin.get(events_path(job_id)).json
    started = [e for e in body['events'] if e['kind'] == 'started'][0]
    assert started['detail'] == {'worker': 'test-worker'}
    failed = body['events'][-1]
    assert failed['detail']['internalMessage'] == SECRET
    assert failed['detail']['worker'] == 'test-worker'


def test_another_user_gets_404_as_for_a_missing_job(api):
    job_id = api.create()
    response = api.b.get(events_path(job_id))
    assert response.status == 404 and response.error_code == 'JOB_NOT_FOUND'
    missing = api.b.get(events_path('00000000-0000-7000-8000-000000000000'))
    assert missing.json == response.json
    assert api.anon.get(events_path(job_id)).status == 401


def test_after_and_limit_page_through_the_history(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id)
    everything = api.a.get(events_path(job_id)).json['events']
    assert len(everything) >= 3
    first = api.a.get(events_path(job_id), query={'limit': 2}).json
    assert first['events'] == everything[:2] and first['nextAfter'] == everything[1]['id']
    rest = api.a.get(events_path(job_id), query={'after': first['nextAfter']}).json
    assert rest['events'] == everything[2:] and rest['nextAfter'] is None
    last = everything[-1]['id']
    assert api.a.get(events_path(job_id), query={'after': last}).json['events'] == []


def test_bad_parameters_are_400_and_change_nothing(api):
    job_id = api.create()
    before = AiJobEvent.select().count()
    for query, field in (
        ({'after': '-1'}, 'after'),
        ({'after': 'x'}, 'after'),
        ({'limit': '0'}, 'limit'),
        ({'limit': '1001'}, 'limit'),
        ({'kind': 'failed'}, 'kind'),
    ):
        response = api.a.get(events_path(job_id), query=query)
        assert response.status == 400 and response.error_code == 'INVALID_REQUEST', query
        assert response.json['error']['field'] == field
    assert AiJobEvent.select().count() == before


@pytest.mark.slow
def test_a_running_job_s_history_over_http_in_order(live_api):
    job_id = live_api.create(input={'sleepMs': 600, 'progressSteps': 4})

    def finished():
        body = live_api.a.get(events_path(job_id)).json
        return body if body['lifecycleStatus'] == 'succeeded' else None

    body = wait_until(finished, timeout=20)
    assert [e['kind'] for e in body['events']] == [
        'created',
        'dispatched',
        'started',
        'progress',
        'progress',
        'progress',
        'progress',
        'succeeded',
    ]
    # Each report crossed a new ten; a provider's last report is 99, the success is 100.
    assert [e['detail']['progress'] for e in body['events'][3:7]] == [25, 50, 75, 99]
    assert all('worker' not in e['detail'] for e in body['events'])
