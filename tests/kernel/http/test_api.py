"""The HTTP API in-process through WSGI: creation and idempotency, status polling, cancel,
ownership, the admin endpoints and every public error code (contracts §7). Jobs are moved along the
state machine by the lifecycle repository here; test_api_lifecycle.py runs real workers."""

import dataclasses
import re
import threading
import time

import pytest

from engine.core.models import AiJob, AiJobSnapshot, ApiToken, OutboxEvent
from engine.core.registry import JobDefinitionRegistry
from engine.http import json_body
from engine.http.app import create_app
from engine.http.auth import TOKEN_CACHE_S, TokenStore
from engine.http.openapi import common_schemas
from engine.jobtypes.synthetic import SYNTHETIC_JOB_DEFINITION, synthetic_definition
from tests.support.api import ADMIN_JOBS, JOBS, Harness, job_body, run_to_failed, run_to_running
from tests.support.helpers import run_threads, wait_until
from tests.support.wsgi import WsgiClient

JSON_TYPE = 'application/json'


def counts():
    return AiJob.select().count(), AiJobSnapshot.select().count(), OutboxEvent.select().count()


# ---------------------------------------------------------------- creation
def test_create_returns_201_with_the_job_status_response_owned_by_the_caller(api):
    response = api.a.post(JOBS, job_body(input={'sleepMs': 1}))
    assert response.status == 201
    body = response.json
    assert set(body) == {
        'jobId',
        'jobType',
        'lifecycleStatus',
        'queueName',
        'priority',
        'progress',
        'createdAt',
        'publicAccessToken',
    }
    assert (
        body['jobType'],
        body['lifecycleStatus'],
        body['queueName'],
        body['priority'],
        body['progress'],
    ) == ('synthetic', 'queued', 'ai-interactive', 50, 0)
    assert body['createdAt'].endswith('Z')
    assert response.headers['location'] == '/api/ai/jobs/%s' % body['jobId']
    assert AiJob.get_by_id(body['jobId']).user_id == 'user-a'


def test_overrides_are_passed_to_the_service(api):
    body = api.a.post(JOBS, job_body(overrides={'priority': 7, 'promptVersion': 'v2'})).json
    job = AiJob.get_by_id(body['jobId'])
    assert (body['priority'], job.priority, job.prompt_version) == (7, 7, 'v2')


@pytest.mark.parametrize(
    'field,value',
    [
        ('userId', 'user-b'),
        ('status', 'succeeded'),
        ('lifecycleStatus', 'succeeded'),
        ('lockedBy', 'me'),
        ('lockUntil', '2099-01-01T00:00:00Z'),
        ('attemptNo', 9),
        ('retryCount', 0),
        ('internalErrorMessage', 'x'),
        ('jobId', 'mine'),
        ('progress', 100),
    ],
)
def test_fields_a_client_may_not_set_are_refused_and_nothing_is_written(api, field, value):
    response = api.a.post(JOBS, job_body(**{field: value}))
    assert response.status == 400 and response.error_code == 'INVALID_REQUEST'
    assert response.json['error']['field'] == field and field in response.json['error']['message']
    assert counts() == (0, 0, 0)


def test_idempotency_key_header_replay_is_200_with_the_same_job(api):
    first = api.a.post(JOBS, job_body(input={'a': 1}), headers={'Idempotency-Key': 'k1'})
    replay = api.a.post(JOBS, job_body(input={'a': 1}), headers={'Idempotency-Key': 'k1'})
    assert (first.status, replay.status) == (201, 200)
    assert replay.json['jobId'] == first.json['jobId']
    assert counts() == (1, 1, 1)


def test_idempotency_key_in_the_body_works_the_same(api):
    first = api.a.post(JOBS, job_body(key='k1'))
    replay = api.a.post(JOBS, job_body(key='k1'))
    assert (first.status, replay.status) == (201, 200)
    assert replay.json['jobId'] == first.json['jobId']


def test_same_key_with_a_different_body_is_422_and_writes_nothing(api):
    api.a.post(JOBS, job_body(key='k1', input={'a': 1}))
    response = api.a.post(JOBS, job_body(key='k1', input={'a': 2}))
    assert response.status == 422 and response.error_code == 'IDEMPOTENCY_KEY_REUSED'
    assert counts() == (1, 1, 1)


def test_header_and_body_keys_that_differ_are_400(api):
    response = api.a.post(JOBS, job_body(key='k1'), headers={'Idempotency-Key': 'k2'})
    assert response.status == 400 and response.json['error']['field'] == 'idempotencyKey'


def test_keys_are_per_user(api):
    a = api.a.post(JOBS, job_body(key='k1')).json['jobId']
    b = api.b.post(JOBS, job_body(key='k1')).json['jobId']
    assert a != b


def test_fifty_concurrent_identical_posts_make_one_job(api):
    results, errors = run_threads(
        50, lambda i: api.a.post(JOBS, job_body(key='race', input={'x': 1})), api.runtime.store
    )
    assert errors == [None] * 50
    assert sorted(r.status for r in results) == [200] * 49 + [201]
    assert len({r.json['jobId'] for r in results}) == 1
    assert counts() == (1, 1, 1)


def test_a_definition_that_opts_out_is_not_creatable_through_the_api(make_runtime):
    registry = JobDefinitionRegistry()
    registry.register(SYNTHETIC_JOB_DEFINITION)
    registry.register(
        dataclasses.replace(synthetic_definition('internal_only'), api_creatable=False)
    )
    runtime = make_runtime(registry=registry)
    with runtime.store.connection():
        harness = Harness(runtime)
        response = harness.a.post(JOBS, job_body(jobType='internal_only'))
        assert response.status == 400 and response.error_code == 'UNKNOWN_JOB_TYPE'
        assert 'internal_only' not in str(
            harness.app_document()['components']['schemas']['CreateJobRequest']
        )
        assert AiJob.select().count() == 0


# ---------------------------------------------------------------- request errors
@pytest.mark.parametrize(
    'body,code,field',
    [
        (job_body(jobType='nope'), 'UNKNOWN_JOB_TYPE', None),
        ({'targetType': 'note', 'targetId': 'n'}, 'INVALID_REQUEST', 'jobType'),
        (job_body(targetId=''), 'INVALID_REQUEST', 'targetId'),
        (job_body(input={'sleepMs': -1}), 'INVALID_INPUT', 'input.sleepMs'),
        (job_body(input=[1]), 'INVALID_INPUT', 'input'),
        (job_body(overrides={'priority': 500}), 'INVALID_REQUEST', 'overrides.priority'),
    ],
)
def test_invalid_bodies_are_400_naming_the_field(api, body, code, field):
    response = api.a.post(JOBS, body)
    assert response.status == 400 and response.error_code == code, response
    assert response.json['error'].get('field') == field
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize('raw', [b'{"jobType": ', b'[1, 2]', b'{"input": NaN}', b'\xff\xfe'])
def test_malformed_json_is_400_invalid_json(api, raw):
    response = api.a.post(JOBS, body=raw, content_type='application/json')
    assert response.status == 400 and response.error_code == 'INVALID_JSON'


@pytest.mark.parametrize(
    'raw',
    [
        b'{"jobType": "synthetic", "targetType": "\\ud800", "targetId": "n", "input": {}}',
        b'{"jobType": "synthetic", "targetType": "t", "targetId": "n", "input": {"\\udfff": 1}}',
        b'{"jobType": "synthetic", "targetType": "t", "targetId": "n", "input": ["\\ud83d"]}',
    ],
)
def test_a_lone_surrogate_anywhere_is_400_and_writes_nothing(api, raw):
    response = api.a.post(JOBS, body=raw, content_type='application/json')
    assert response.status == 400 and response.error_code == 'INVALID_JSON'
    assert AiJob.select().count() == 0


@pytest.mark.parametrize('depth', [65, 1000, 5000])
def test_nesting_past_the_limit_is_400_saying_so(api, depth):
    nested = '[' * depth + ']' * depth
    raw = '{"jobType": "synthetic", "targetType": "t", "targetId": "n", "input": {"a": %s}}'
    response = api.a.post(JOBS, body=(raw % nested).encode(), content_type='application/json')
    assert response.status == 400 and response.error_code == 'INVALID_REQUEST'
    assert 'nested deeper' in response.json['error']['message']
    assert AiJob.select().count() == 0


def test_nesting_within_the_limit_is_accepted(api):
    nested = {'a': [[[[[[[[[[1]]]]]]]]]]}
    assert api.a.post(JOBS, job_body(input={'output': nested})).status == 201


# ---------------------------------------------------------------- numbers (issue 24)
CREATE_RAW = '{"jobType": "synthetic", "targetType": "t", "targetId": "n", %s}'


@pytest.mark.parametrize(
    'fields',
    [
        '"input": {"a": 1e400}',
        '"input": {"a": -1e400}',
        '"input": {"output": {"deep": [1, {"x": 1E+400}]}}',
        '"input": {}, "overrides": {"priority": 1e400}',
        '"input": {}, "overrides": {"priority": -1e400}',
        '"input": {}, "overrides": {"promptVersion": -1e400}',
    ],
)
def test_a_number_beyond_a_double_is_400_invalid_json_and_writes_nothing(api, fields):
    response = api.a.post(JOBS, body=(CREATE_RAW % fields).encode(), content_type=JSON_TYPE)
    assert response.status == 400 and response.error_code == 'INVALID_JSON', response
    assert 'largest a double' in response.json['error']['message']
    assert counts() == (0, 0, 0)


def test_a_number_that_would_become_zero_is_400(api):
    raw = CREATE_RAW % '"input": {"a": 1e-400}'
    response = api.a.post(JOBS, body=raw.encode(), content_type=JSON_TYPE)
    assert response.status == 400 and response.error_code == 'INVALID_JSON', response
    assert 'would become 0' in response.json['error']['message']
    zero = (CREATE_RAW % '"input": {"a": 0e-400}').encode()
    assert api.a.post(JOBS, body=zero, content_type=JSON_TYPE).status == 201


@pytest.mark.parametrize('number', [10**400, -(10**999) + 1, 2**64 + 1, 1.7976931348623157e308])
def test_a_huge_number_within_the_limits_round_trips_exactly(api, number):
    body = job_body(key='big', input={'output': {'n': number}})
    first = api.a.post(JOBS, body)
    assert first.status == 201, first
    snapshot = AiJobSnapshot.get(AiJobSnapshot.job_id == first.json['jobId'])
    assert snapshot.content['input']['output']['n'] == number
    assert type(snapshot.content['input']['output']['n']) is type(number)
    replay = api.a.post(JOBS, body)  # the fingerprint hashed the same value
    assert replay.status == 200 and replay.json['jobId'] == first.json['jobId']


@pytest.mark.parametrize('sign', ['', '-'])
def test_an_integer_past_the_digit_limit_is_400_naming_it(api, sign):
    raw = CREATE_RAW % ('"input": {"a": %s%s}' % (sign, '9' * (json_body.MAX_INTEGER_DIGITS + 1)))
    response = api.a.post(JOBS, body=raw.encode(), content_type=JSON_TYPE)
    assert response.status == 400 and response.error_code == 'INVALID_JSON', response
    assert '1000 digits' in response.json['error']['message']
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    'raw,says',
    [
        (CREATE_RAW % '"input": {}, "input": {"a": 1}', 'same key twice'),
        (CREATE_RAW % '"input": {"a": 1, "a": 1}', 'same key twice'),
        ('\ufeff' + CREATE_RAW % '"input": {}', 'byte order mark'),
        (CREATE_RAW % '"input": {}' + ' {}', 'not valid JSON'),
    ],
)
def test_duplicate_keys_a_bom_and_trailing_text_are_400(api, raw, says):
    response = api.a.post(JOBS, body=raw.encode('utf-8'), content_type=JSON_TYPE)
    assert response.status == 400 and response.error_code == 'INVALID_JSON', response
    assert says in response.json['error']['message']
    assert counts() == (0, 0, 0)


def test_the_same_number_rules_hold_for_webhook_and_credential_bodies(keyed_api):
    for path in ('/api/ai/webhooks', '/api/ai/credentials'):
        for raw in (b'{"url": 1e400}', b'{"apiKey": "sk-x", "provider": -1e400}'):
            response = keyed_api.a.post(path, body=raw, content_type=JSON_TYPE)
            assert response.status == 400 and response.error_code == 'INVALID_JSON', response


@pytest.mark.parametrize(
    'digits,valid',
    [('9' * 5000, False), ('1' + '0' * 20, False), ('0' * 5000 + '5', True)],
    ids=['5000 nines', '1e20', 'leading zeros'],
)
def test_a_query_number_of_any_length_is_a_clean_answer(api, digits, valid):
    """Thousands of digits are judged by their length, never converted (past Python's limit
    int() raises); leading zeros do not change the number."""
    job_id = api.create()
    for client, path, name in (
        (api.admin, ADMIN_JOBS, 'limit'),
        (api.a, JOBS, 'limit'),
        (api.a, JOBS + '/' + job_id + '/events', 'after'),
        (api.admin, '/admin-api/ai/webhook-deliveries', 'limit'),
        (api.a, JOBS + '/' + job_id, 'waitMs'),
    ):
        response = client.get(path, query=[(name, digits)])
        if valid:
            assert response.status == 200, (path, response)
        else:
            assert response.status == 400 and response.json['error']['field'] == name, response


@pytest.mark.parametrize('fill', ['k', '\U0001f600', '\x00'])
def test_an_idempotency_key_at_its_limit_is_stored_and_replayed(api, fill):
    """255 characters (4-byte ones, NUL): the job keeps the key as sent, the same request again
    is the same job; the outbox's dedupe key (job type, user and key) stays within its column."""
    key = fill * 255
    first = api.a.post(JOBS, job_body(key=key))
    assert first.status == 201, first
    assert AiJob.get_by_id(first.json['jobId']).idempotency_key == key
    replay = api.a.post(JOBS, job_body(key=key))
    assert replay.status == 200 and replay.json['jobId'] == first.json['jobId']
    assert counts() == (1, 1, 1)


def test_header_bytes_that_are_not_utf8_are_no_token_or_a_400(api):
    raw_token = WsgiClient(api.app, 'aj_' + 'x' * 20 + '\xff', api.check)
    response = raw_token.get(JOBS + '/x')
    assert response.status == 401 and response.error_code == 'UNAUTHORIZED'
    keyed = api.a.post(JOBS, job_body(), headers={'Idempotency-Key': 'key-\xff'})
    assert keyed.status == 400 and keyed.json['error']['field'] == 'idempotencyKey'
    utf8 = 'clé'.encode('utf-8').decode('latin-1')  # how WSGI hands over UTF-8 header bytes
    assert api.a.post(JOBS, job_body(), headers={'Idempotency-Key': utf8}).status == 201
    assert AiJob.select().count() == 1


@pytest.mark.parametrize('wait', ['²', '①', '-1', '1.5', ' 1'])
def test_a_wait_that_is_not_ascii_digits_is_400(api, wait):
    job_id = api.create()
    response = api.a.get(JOBS + '/' + job_id, query={'waitMs': wait})
    assert response.status == 400 and response.json['error']['field'] == 'waitMs'


def test_a_body_over_the_limit_is_413(make_runtime):
    runtime = make_runtime(AIJOB_MAX_BODY_BYTES='200')
    with runtime.store.connection():
        harness = Harness(runtime)
        response = harness.a.post(JOBS, job_body(input={'output': {'text': 'x' * 300}}))
        assert response.status == 413 and response.error_code == 'PAYLOAD_TOO_LARGE'
        assert AiJob.select().count() == 0


def test_a_body_that_is_not_json_is_415(api):
    response = api.a.post(JOBS, body=b'jobType=synthetic', content_type='text/plain')
    assert response.status == 415 and response.error_code == 'UNSUPPORTED_MEDIA_TYPE'


def test_wrong_method_is_405_and_unknown_path_is_404_both_json(api):
    response = api.a.request('DELETE', JOBS)
    assert response.status == 405 and response.error_code == 'METHOD_NOT_ALLOWED'
    response = api.a.get('/api/ai/nothing-here')
    assert response.status == 404 and response.error_code == 'NOT_FOUND'


@pytest.mark.parametrize(
    'header',
    [
        None,
        'Bearer',
        'Basic dXNlcjpwYXNz',
        'Bearer short',
        'Bearer aj_' + 'x' * 43,
        'Bearer !!not-a-token-at-all!!',
    ],
)
def test_missing_malformed_or_unknown_tokens_are_401(api, header):
    headers = {'Authorization': header} if header else {}
    for method, path in (('POST', JOBS), ('GET', JOBS + '/x'), ('GET', ADMIN_JOBS)):
        response = api.anon.request(method, path, headers=headers, json_body=job_body())
        assert response.status == 401 and response.error_code == 'UNAUTHORIZED'
    assert AiJob.select().count() == 0


def test_a_revoked_token_is_401(api):
    assert TokenStore(api.runtime.store).revoke(api.tokens['a'])
    response = api.a.post(JOBS, job_body())
    assert response.status == 401 and response.error_code == 'UNAUTHORIZED'


def test_a_token_revoked_while_in_use_stops_working_within_a_second(api):
    job_id = api.create()
    assert api.a.get(JOBS + '/' + job_id).status == 200  # the token is now cached
    assert TokenStore(api.runtime.store).revoke(api.tokens['a'])
    # Within the cache's lifetime (under a second), with a margin for a slow machine.
    wait_until(
        lambda: api.a.get(JOBS + '/' + job_id).status == 401,
        timeout=TOKEN_CACHE_S + 1,
        interval=0.05,
    )


def test_only_the_token_hash_is_stored(api):
    hashes = {row.token_hash for row in ApiToken.select()}
    assert all(len(h) == 64 for h in hashes)
    assert not set(api.tokens.values()) & hashes


# ---------------------------------------------------------------- status polling
def test_status_has_an_etag_and_if_none_match_gives_304(api):
    job_id = api.create()
    first = api.a.get(JOBS + '/' + job_id)
    assert first.status == 200 and first.headers['etag']
    again = api.a.get(JOBS + '/' + job_id, headers={'If-None-Match': first.headers['etag']})
    assert again.status == 304 and again.body == b''
    run_to_running(api.runtime, job_id)
    changed = api.a.get(JOBS + '/' + job_id, headers={'If-None-Match': first.headers['etag']})
    assert changed.status == 200 and changed.json['lifecycleStatus'] == 'running'
    assert changed.json['startedAt'] and changed.headers['etag'] != first.headers['etag']


def test_wait_returns_as_soon_as_the_job_changes(api):
    job_id = api.create()
    etag = api.a.get(JOBS + '/' + job_id).headers['etag']
    timer = threading.Timer(
        0.3, lambda: _in_connection(api, lambda: run_to_running(api.runtime, job_id))
    )
    timer.start()
    started = time.monotonic()
    response = api.a.get(
        JOBS + '/' + job_id, query={'waitMs': 30000}, headers={'If-None-Match': etag}
    )
    elapsed = time.monotonic() - started
    timer.join()
    # The change it reports, and before the wait's own end (30 s, the longest allowed; the
    # change comes at 0.3 s): it woke on the change, not at its timeout.
    assert response.status == 200 and response.json['lifecycleStatus'] == 'running'
    assert elapsed < 30.0


def test_wait_times_out_with_304_when_nothing_changes(api):
    job_id = api.create()
    etag = api.a.get(JOBS + '/' + job_id).headers['etag']
    started = time.monotonic()
    response = api.a.get(
        JOBS + '/' + job_id, query={'waitMs': 300}, headers={'If-None-Match': etag}
    )
    # Not before the wait asked for (the server's clock starts after this one's): it waited.
    assert response.status == 304 and time.monotonic() - started >= 0.3


def test_wait_on_a_terminal_job_returns_at_once(api):
    job_id = api.create()
    api.a.post(JOBS + '/%s/cancel' % job_id)
    started = time.monotonic()
    response = api.a.get(JOBS + '/' + job_id, query={'waitMs': 30000})
    # Before the wait's end (30 s, the longest allowed): it did not wait for a change.
    assert response.status == 200 and time.monotonic() - started < 30.0
    assert response.json['lifecycleStatus'] == 'cancelled'


@pytest.mark.parametrize('value', ['-1', '30001', 'soon'])
def test_wait_ms_out_of_range_is_400(api, value):
    job_id = api.create()
    response = api.a.get(JOBS + '/' + job_id, query={'waitMs': value})
    assert response.status == 400 and response.json['error']['field'] == 'waitMs'


def _in_connection(api, work):
    with api.runtime.store.connection():
        return work()


# ---------------------------------------------------------------- cancel
def test_cancel_a_queued_job_is_200_cancelled_then_409_already_cancelled(api):
    job_id = api.create()
    response = api.a.post(JOBS + '/%s/cancel' % job_id)
    assert response.status == 200 and response.json['lifecycleStatus'] == 'cancelled'
    assert response.json['errorCode'] == 'CANCELLED'
    again = api.a.post(JOBS + '/%s/cancel' % job_id)
    assert again.status == 409 and again.error_code == 'JOB_ALREADY_CANCELLED'


def test_cancel_a_running_job_is_202_and_requests_cancellation(api):
    job_id = api.create()
    run_to_running(api.runtime, job_id)
    response = api.a.post(JOBS + '/%s/cancel' % job_id)
    assert response.status == 202 and response.json['lifecycleStatus'] == 'running'
    assert AiJob.get_by_id(job_id).cancel_requested_at is not None


def test_cancel_a_finished_job_is_409_not_cancellable(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id)
    response = api.a.post(JOBS + '/%s/cancel' % job_id)
    assert response.status == 409 and response.error_code == 'JOB_NOT_CANCELLABLE'


# ---------------------------------------------------------------- ownership
def test_another_user_gets_404_on_every_per_job_endpoint(api):
    job_id = api.create()
    before = AiJob.get_by_id(job_id).updated_at
    for method, path in (
        ('GET', JOBS + '/' + job_id),
        ('GET', JOBS + '/%s/artifacts' % job_id),
        ('POST', JOBS + '/%s/cancel' % job_id),
    ):
        response = api.b.request(method, path)
        assert response.status == 404 and response.error_code == 'JOB_NOT_FOUND', (method, path)
        missing = api.b.request(
            method, path.replace(job_id, '00000000-0000-7000-8000-000000000000')
        )
        assert missing.json == response.json  # indistinguishable from "no such job"
    assert AiJob.get_by_id(job_id).updated_at == before


def test_admin_may_read_any_job_but_only_the_owner_cancels(api):
    job_id = api.create()
    assert api.admin.get(JOBS + '/' + job_id).status == 200
    assert api.admin.get(JOBS + '/%s/artifacts' % job_id).status == 200
    assert api.admin.post(JOBS + '/%s/cancel' % job_id).status == 404
    assert AiJob.get_by_id(job_id).lifecycle_status == 'queued'


def test_users_get_403_on_every_admin_endpoint(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id)
    for method, path in (('GET', ADMIN_JOBS), ('POST', ADMIN_JOBS + '/%s/retry' % job_id)):
        response = api.a.request(method, path)
        assert response.status == 403 and response.error_code == 'FORBIDDEN'
    assert AiJob.select().count() == 1


def test_internal_error_message_is_for_super_admin_only(api):
    job_id = api.create()
    run_to_failed(api.runtime, job_id, internal='upstream 500 from internal.example')
    user_view = api.a.get(JOBS + '/' + job_id)
    assert user_view.json['errorCode'] == 'PROVIDER_UNAVAILABLE'
    assert user_view.json['publicErrorMessage'] == 'The AI provider is unavailable.'
    assert (
        b'internal.example' not in user_view.body and b'internalErrorMessage' not in user_view.body
    )
    admin_view = api.admin.get(JOBS + '/' + job_id)
    assert b'internalErrorMessage' not in admin_view.body  # §7.2 is the same for everyone
    item = api.admin.get(ADMIN_JOBS).json['items'][0]
    assert item['internalErrorMessage'] == 'upstream 500 from internal.example'


# ---------------------------------------------------------------- admin list
def test_admin_list_filters(api):
    a1 = api.create(input={'n': 1})
    time.sleep(0.005)  # distinct milliseconds for the created-at range below
    a2 = api.create(input={'n': 2})
    time.sleep(0.005)
    b1 = api.create(api.b)
    api.a.post(JOBS + '/%s/cancel' % a2)
    run_to_failed(api.runtime, b1)

    def ids(**query):
        response = api.admin.get(ADMIN_JOBS, query=query)
        assert response.status == 200, response
        return [item['jobId'] for item in response.json['items']]

    assert ids() == [b1, a2, a1]  # newest first
    assert ids(userId='user-a') == [a2, a1]
    assert ids(lifecycleStatus='queued') == [a1]
    assert ids(lifecycleStatus='pending') == [a1]  # legacy name (contracts §1.5)
    assert ids(lifecycleStatus='cancelled,failed') == [b1, a2]
    assert ids(jobType='synthetic', queueName='ai-interactive') == [b1, a2, a1]
    assert ids(jobType='synthetic', queueName='ai-background') == []  # their own index
    assert ids(jobType='synthetic', queueName='ai-interactive', userId='user-b') == [b1]
    assert ids(jobType='other') == [] and ids(queueName='ai-background') == []
    created = api.a.get(JOBS + '/' + a2).json['createdAt']
    assert ids(createdFrom=created) == [b1, a2]
    assert ids(createdTo=created) == [a1]
    assert ids(createdFrom='2000-01-01T00:00:00+02:00', createdTo='2000-01-02T00:00:00Z') == []


def test_admin_list_pages_with_a_cursor_and_a_bounded_size(api):
    made = [api.create(input={'n': n}) for n in range(7)]
    seen, cursor = [], None
    while True:
        query = {'limit': 3}
        if cursor:
            query['cursor'] = cursor
        page = api.admin.get(ADMIN_JOBS, query=query).json
        assert len(page['items']) <= 3 and page['limit'] == 3
        seen += [item['jobId'] for item in page['items']]
        cursor = page['nextCursor']
        if cursor is None:
            break
    assert seen == list(reversed(made))
    assert api.admin.get(ADMIN_JOBS).json['limit'] == 20


@pytest.mark.parametrize(
    'query,field',
    [
        ({'limit': '101'}, 'limit'),
        ({'limit': '0'}, 'limit'),
        ({'cursor': 'bogus'}, 'cursor'),
        ({'lifecycleStatus': 'exploded'}, 'lifecycleStatus'),
        ({'queueName': 'q'}, 'queueName'),
        ({'createdFrom': 'yesterday'}, 'createdFrom'),
        ({'sort': 'id'}, 'sort'),
    ],
)
def test_admin_list_rejects_bad_parameters_naming_them(api, query, field):
    response = api.admin.get(ADMIN_JOBS, query=query)
    assert response.status == 400 and response.json['error']['field'] == field


# ---------------------------------------------------------------- admin retry
def test_admin_retry_makes_a_new_linked_job_with_the_old_input(api):
    job_id = api.create(input={'sleepMs': 3, 'output': {'k': 'v'}}, overrides={'priority': 9})
    run_to_failed(api.runtime, job_id)
    response = api.admin.post(ADMIN_JOBS + '/%s/retry' % job_id)
    assert response.status == 201
    new = response.json
    assert new['jobId'] != job_id and new['retryOfJobId'] == job_id
    assert (new['userId'], new['lifecycleStatus'], new['priority']) == ('user-a', 'queued', 9)
    assert api.runtime.service.snapshot(new['jobId']) == api.runtime.service.snapshot(job_id)
    assert AiJob.get_by_id(job_id).lifecycle_status == 'failed'
    assert api.a.get(JOBS + '/' + new['jobId']).status == 200  # it belongs to the user


def test_admin_retry_of_an_unfinished_job_is_409_and_of_a_missing_one_404(api):
    job_id = api.create()
    response = api.admin.post(ADMIN_JOBS + '/%s/retry' % job_id)
    assert response.status == 409 and response.error_code == 'JOB_NOT_RETRYABLE'
    response = api.admin.post(ADMIN_JOBS + '/nope/retry')
    assert response.status == 404 and response.error_code == 'JOB_NOT_FOUND'
    assert AiJob.select().count() == 1


# ---------------------------------------------------------------- limits (contracts §7.3)
def test_too_many_unfinished_jobs_is_429_with_retry_after(make_runtime):
    runtime = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='2')
    with runtime.store.connection():
        harness = Harness(runtime)
        first, _ = harness.create(), harness.create()
        response = harness.a.post(JOBS, job_body())
        assert response.status == 429 and response.error_code == 'TOO_MANY_JOBS'
        assert int(response.headers['retry-after']) > 0
        assert AiJob.select().count() == 2
        assert harness.b.post(JOBS, job_body()).status == 201  # per user
        harness.a.post(JOBS + '/%s/cancel' % first)  # a finished job frees a slot
        assert harness.a.post(JOBS, job_body()).status == 201


def test_the_daily_quota_is_429_until_midnight_utc(make_runtime):
    runtime = make_runtime(AIJOB_DAILY_JOB_QUOTA='2')
    with runtime.store.connection():
        harness = Harness(runtime)
        for _ in range(2):
            harness.a.post(JOBS + '/%s/cancel' % harness.create())
        response = harness.a.post(JOBS, job_body())
        assert response.status == 429 and response.error_code == 'QUOTA_EXCEEDED'
        assert 0 < int(response.headers['retry-after']) <= 86400
        assert AiJob.select().count() == 2


def test_platform_key_mode_without_a_platform_key_is_503(make_runtime):
    # The OpenAI-compatible provider needs a key; none is configured for the platform.
    runtime = make_runtime(AIJOB_PROVIDER_BASE_URL='http://127.0.0.1:9/v1')
    with runtime.store.connection():
        harness = Harness(runtime)
        response = harness.a.post(
            JOBS, job_body(jobType='flashcard_generation', input={'text': 'Photosynthesis.'})
        )
        assert response.status == 503 and response.error_code == 'PLATFORM_UNAVAILABLE'
        assert int(response.headers['retry-after']) > 0
        assert AiJob.select().count() == 0


# ---------------------------------------------------------------- operations and failures
def test_healthz_and_readyz(api):
    assert api.anon.get('/healthz').json == {'status': 'ok'}
    ready = api.anon.get('/readyz')
    assert ready.status == 200 and ready.json['checks'] == {'database': 'ok', 'queue': 'ok'}


def test_an_unreachable_store_is_503_on_readyz_and_service_unavailable_elsewhere(
    make_runtime, backend
):
    good = make_runtime()
    harness = Harness(good)
    bad_url = (
        'sqlite:////nonexistent-dir/aijob.db'
        if backend.name == 'sqlite+memory'
        else 'mysql://root@127.0.0.1:1/nowhere'
    )
    bad = make_runtime(AIJOB_DATABASE_URL=bad_url)  # re-points the models at a dead store
    client = WsgiClient(create_app(bad), harness.tokens['a'], harness.check)
    ready = client.get('/readyz')
    assert ready.status == 503 and ready.error_code == 'NOT_READY'
    assert ready.json['checks']['database'] == 'unavailable'
    response = client.post(JOBS, job_body())
    assert response.status == 503 and response.error_code == 'STORE_UNAVAILABLE'
    assert int(response.headers['retry-after']) > 0
    assert client.get('/healthz').status == 200


def test_an_unexpected_error_is_a_clean_500(api, monkeypatch):
    def explode(request):
        raise RuntimeError('SELECT secret FROM /work/main/engine/service.py')

    monkeypatch.setattr(api.runtime.service, 'create_job', explode)
    response = api.a.post(JOBS, job_body())
    assert response.status == 500
    assert response.json == {'error': {'code': 'INTERNAL_ERROR', 'message': 'Internal error.'}}


def test_openapi_documents_every_route_of_the_app(api):
    document = api.anon.get('/openapi.json').json
    assert document['openapi'].startswith('3.1')
    documented = {
        (method.upper(), path) for path, item in document['paths'].items() for method in item
    }

    routes = {(route.method, openapi_path(route.rule)) for route in api.app.routes}
    # bottle answers HEAD through the GET route (without the body), as the document says.
    routes |= {('HEAD', path) for method, path in routes if method == 'GET'}
    assert routes == documented


def openapi_path(rule):
    """bottle's <job_id> (or <job_id:re:...>) is the document's {jobId}."""
    camel = lambda m: '{%s}' % re.sub(r'_(\w)', lambda c: c[1].upper(), m[1])  # noqa: E731
    return re.sub(r'<(\w+)(?::[^>]*)?>', camel, rule)


def test_each_resource_documents_exactly_its_own_routes(api):
    """A resource carries its own part of the document beside its routes (so that it can move
    as a unit): the paths it declares are those of its routes, method for method, and no path
    or schema is declared twice (one would silently replace the other)."""
    resources = api.app.aijob_api.resources
    declared_paths, declared_schemas = [], list(common_schemas())
    for resource in resources:
        paths = resource.paths()
        routes = {(method.lower(), openapi_path(rule)) for method, rule, _, _ in resource.routes()}
        documented = {(method, path) for path, item in paths.items() for method in item}
        assert routes == documented, type(resource).__name__
        declared_paths += list(paths)
        declared_schemas += list(resource.schemas())
    assert sorted(declared_paths) == sorted(set(declared_paths))
    assert sorted(declared_schemas) == sorted(set(declared_schemas))
    document = api.anon.get('/openapi.json').json
    assert list(document['paths']) == declared_paths  # in the resources' order
    assert sorted(document['components']['schemas']) == sorted(declared_schemas)


def test_options_lists_the_methods_and_head_answers_as_get_without_a_body(api):
    job_id = api.create()
    options = api.anon.request('OPTIONS', JOBS + '/' + job_id)
    assert options.status == 204 and options.headers['allow'] == 'GET, HEAD, OPTIONS'
    assert api.anon.request('OPTIONS', JOBS).headers['allow'] == 'GET, POST, HEAD, OPTIONS'
    head = api.a.request('HEAD', JOBS + '/' + job_id)
    get = api.a.get(JOBS + '/' + job_id)
    assert (head.status, head.body, head.headers['etag']) == (200, b'', get.headers['etag'])
    refused = api.a.request('DELETE', JOBS + '/' + job_id)
    assert refused.status == 405 and refused.headers['allow'] == 'GET, HEAD, OPTIONS'


@pytest.mark.parametrize(
    'query,field',
    [
        ({'limit': '²'}, 'limit'),
        ({'limit': '①'}, 'limit'),
        ({'createdTo': ''}, 'createdTo'),  # empty is not absent
        ({'createdFrom': '2026-06-20'}, 'createdFrom'),  # a date, not an RFC 3339 date-time
        ({'createdFrom': '2026-06-20T00:00:00'}, 'createdFrom'),  # no offset
        ({'lifecycleStatus': 'queued,'}, 'lifecycleStatus'),
        ({'cursor': '12.not-a-job-id'}, 'cursor'),
    ],
)
def test_admin_list_parameters_outside_the_document_are_400(api, query, field):
    response = api.admin.get(ADMIN_JOBS, query=query)
    assert response.status == 400 and response.json['error']['field'] == field


def test_admin_list_times_beyond_utc_are_clamped_not_refused(api):
    """Valid RFC 3339 times whose UTC instant is outside year 1..9999 mean "since the start" and
    "until the end"."""
    job_id = api.create()
    query = {'createdFrom': '0001-01-01T00:00:00+14:00', 'createdTo': '9999-12-31T23:59:59-14:00'}
    response = api.admin.get(ADMIN_JOBS, query=query)
    assert response.status == 200 and [i['jobId'] for i in response.json['items']] == [job_id]


def test_usage_with_since_not_before_until_is_an_empty_range(api):
    query = {'since': '2026-01-02T00:00:00Z', 'until': '2026-01-01T00:00:00Z'}
    response = api.admin.get('/admin-api/ai/usage', query=query)
    assert response.status == 200 and response.json['totals'] == []


def test_usage_until_the_first_day_there_is_is_an_empty_range_not_a_500(api):
    """A default ``since`` a day before ``until`` would fall before year 1: it stops there (the
    fuzz suite found ``until=0001-01-01T00:00:00Z`` answering 500)."""
    for until in ('0001-01-01T00:00:00Z', '0001-01-01T12:00:00Z', '0001-01-01T00:00:00+14:00'):
        response = api.admin.get('/admin-api/ai/usage', query={'until': until})
        assert response.status == 200 and response.json['totals'] == []


def test_usage_times_beyond_utc_are_clamped_and_bad_ones_are_400(api):
    response = api.admin.get('/admin-api/ai/usage', query={'until': '9999-12-31T23:59:59-14:00'})
    assert response.status == 200 and response.json['until'].startswith('9999-12-31T23:59:59')
    for query in ({'until': ''}, {'until': 'tomorrow'}, {'since': '2026-01-01 00:00:00Z'}):
        response = api.admin.get('/admin-api/ai/usage', query=query)
        assert response.status == 400 and response.json['error']['field'] in query


def test_a_whole_number_written_as_a_float_is_an_integer(api):
    """JSON (and the document's schema) make 48.0 the integer 48: a priority so written is
    taken, not refused."""
    response = api.a.post(JOBS, job_body(overrides={'priority': 48.0}))
    assert response.status == 201 and response.json['priority'] == 48
    response = api.a.post(JOBS, job_body(overrides={'priority': 48.5}))
    assert response.status == 400 and response.json['error']['field'] == 'overrides.priority'
