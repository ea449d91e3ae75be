"""A job's ``publicAccessToken`` and CORS (issue 33, item 3), on both backend pairs: every create
answer carries one (a user's, a service key's, a JWT's, an idempotent replay's); it reads, polls,
streams and cancels its job, is 404 on any other job, 401 once expired or forged, 403 for a
create or a list; another process (another app on the same store) verifies it, with or without
a master key. AIJOB_CORS_ORIGINS: the job endpoints answer those origins, and a preflight."""

import jwt
import pytest

from engine.core.models import AiJob
from engine.http.job_tokens import JobTokens
from tests.features.streams.test_stream import parse
from tests.kernel.http.test_service_keys import with_service
from tests.support.api import JOBS, Harness, job_body, run_to_failed
from tests.support.runtimes import MASTER_KEY

ORIGIN = 'https://app.example.com'


def created(client, **kw):
    response = client.post(JOBS, job_body(**kw))
    assert response.status in (200, 201), response
    return response.json


@pytest.fixture
def pat_api(api):
    return with_service(api)


def test_every_create_answer_carries_a_token_for_that_job(pat_api):
    mine = created(pat_api.a, key='k1')
    assert mine['publicAccessToken'].startswith('pat_')
    replay = created(pat_api.a, key='k1')
    assert replay['jobId'] == mine['jobId'] and replay['publicAccessToken'].startswith('pat_')
    for_user = created(pat_api.svc, userId='user-b')
    browser = pat_api.client(for_user['publicAccessToken'])
    assert browser.get(JOBS + '/' + for_user['jobId']).json['jobId'] == for_user['jobId']


def test_the_token_reads_polls_and_follows_its_job_only(pat_api):
    job = created(pat_api.a)
    other = created(pat_api.a)['jobId']
    browser = pat_api.client(job['publicAccessToken'])
    path = JOBS + '/' + job['jobId']
    first = browser.get(path)
    assert first.status == 200 and first.json['lifecycleStatus'] == 'queued'
    unchanged = browser.get(path, headers={'If-None-Match': first.headers['etag']})
    assert unchanged.status == 304
    assert browser.get(path + '/events').json['events'][0]['kind'] == 'created'
    assert browser.get(path + '/artifacts').status == 200
    # Any other job, even the same user's, is not found; so is one that does not exist.
    for job_id in (other, '0' * 26):
        for suffix in ('', '/events', '/artifacts', '/stream'):
            hidden = browser.get(JOBS + '/' + job_id + suffix)
            assert hidden.status == 404 and hidden.error_code == 'JOB_NOT_FOUND', hidden
        assert browser.post(JOBS + '/' + job_id + '/cancel').status == 404
    assert pat_api.runtime.lifecycle.get(other).lifecycle_status == 'queued'


def test_the_token_streams_its_job(pat_api):
    job = created(pat_api.a)
    run_to_failed(pat_api.runtime, job['jobId'])
    browser = pat_api.client(job['publicAccessToken'])
    response = browser.get(JOBS + '/' + job['jobId'] + '/stream')
    assert response.status == 200 and response.headers['content-type'].startswith('text/event')
    messages = [m for m in parse(response.body) if 'event' in m]
    assert messages[0]['event'] == 'status' and messages[-1]['data']['lifecycleStatus'] == 'failed'


def test_the_token_cancels_its_job_where_the_job_type_allows(pat_api):
    job = created(pat_api.a)
    browser = pat_api.client(job['publicAccessToken'])
    cancelled = browser.post(JOBS + '/' + job['jobId'] + '/cancel')
    assert cancelled.status == 200 and cancelled.json['lifecycleStatus'] == 'cancelled'


def test_the_token_cannot_create_list_or_reach_anything_else(pat_api):
    browser = pat_api.client(created(pat_api.a)['publicAccessToken'])
    before = AiJob.select().count()
    for response in (
        browser.post(JOBS, job_body()),
        browser.get(JOBS),
        browser.get('/api/ai/credentials'),
        browser.get('/admin-api/ai/jobs'),
    ):
        assert response.status == 403 and response.error_code == 'FORBIDDEN', response
    assert AiJob.select().count() == before


def test_an_expired_or_forged_token_is_401(pat_api):
    job = created(pat_api.a)
    # Another process on the same store, issuing with a life already over.
    expired = JobTokens(pat_api.runtime.store, None, -60).issue(AiJob.get_by_id(job['jobId']))
    response = pat_api.client(expired).get(JOBS + '/' + job['jobId'])
    assert response.status == 401 and 'expired' in response.json['error']['message']
    forged = 'pat_' + jwt.encode(
        {'aud': 'aijob:job', 'sub': 'user-a', 'job': job['jobId'], 'exp': 2**31},
        'a-guess-at-the-key-that-is-long-enough',
        algorithm='HS256',
    )
    response = pat_api.client(forged).get(JOBS + '/' + job['jobId'])
    assert response.status == 401 and 'not valid' in response.json['error']['message']
    assert pat_api.client('pat_x').get(JOBS + '/' + job['jobId']).status == 401


@pytest.mark.parametrize('master_key', [None, MASTER_KEY])
def test_another_process_verifies_the_token(make_runtime, master_key):
    settings = {'AIJOB_CREDENTIAL_MASTER_KEY': master_key} if master_key else {}
    first = make_runtime(**settings)
    with first.store.connection():
        job = created(Harness(first).a)
        later = Harness(make_runtime(**settings))  # another process, or a restart
        response = later.client(job['publicAccessToken']).get(JOBS + '/' + job['jobId'])
        assert response.status == 200


# ---------------------------------------------------------------- CORS
@pytest.fixture
def cors_api(make_runtime):
    rt = make_runtime(AIJOB_CORS_ORIGINS=ORIGIN + ', https://other.example.com')
    with rt.store.connection():
        yield Harness(rt)


def test_the_job_endpoints_answer_an_allowed_origin(cors_api):
    job = created(cors_api.a)
    browser = cors_api.client(job['publicAccessToken'])
    path = JOBS + '/' + job['jobId']
    for suffix in ('', '/events', '/artifacts'):
        response = browser.get(path + suffix, headers={'Origin': ORIGIN})
        assert response.headers['access-control-allow-origin'] == ORIGIN
        assert 'ETag' in response.headers['access-control-expose-headers']
        assert 'Origin' in response.headers['vary']
    # Errors too, so that a page can read them; but never for another origin.
    missing = browser.get(JOBS + '/' + '0' * 26, headers={'Origin': ORIGIN})
    assert missing.status == 404 and missing.headers['access-control-allow-origin'] == ORIGIN
    stranger = browser.get(path, headers={'Origin': 'https://evil.example.com'})
    assert stranger.status == 200 and 'access-control-allow-origin' not in stranger.headers
    # Not the create, the list or the admin API.
    listed = cors_api.a.get(JOBS, headers={'Origin': ORIGIN})
    assert 'access-control-allow-origin' not in listed.headers


def test_a_preflight_from_an_allowed_origin(cors_api):
    job_id = created(cors_api.a)['jobId']
    asked = {'Origin': ORIGIN, 'Access-Control-Request-Method': 'GET'}
    for suffix in ('', '/stream', '/cancel'):
        response = cors_api.anon.request('OPTIONS', JOBS + '/' + job_id + suffix, headers=asked)
        assert response.status == 204
        assert response.headers['access-control-allow-origin'] == ORIGIN
        assert 'Authorization' in response.headers['access-control-allow-headers']
        assert 'Last-Event-ID' in response.headers['access-control-allow-headers']
        assert response.headers['access-control-allow-methods'] == response.headers['allow']
    evil = dict(asked, Origin='https://evil.example.com')
    response = cors_api.anon.request('OPTIONS', JOBS + '/' + job_id, headers=evil)
    assert response.status == 204 and 'access-control-allow-origin' not in response.headers


def test_without_origins_no_cors_header_at_all(api):
    job = created(api.a)
    response = api.a.get(JOBS + '/' + job['jobId'], headers={'Origin': ORIGIN})
    assert not [name for name in response.headers if name.startswith('access-control')]
    preflight = api.anon.request(
        'OPTIONS',
        JOBS + '/' + job['jobId'],
        headers={'Origin': ORIGIN, 'Access-Control-Request-Method': 'GET'},
    )
    assert not [name for name in preflight.headers if name.startswith('access-control')]
