"""Users' provider keys through HTTP, the admin usage totals, and what the logs may contain."""

import logging

import pytest

from engine.core.logs import JsonFormatter, quiet_sql_logging
from engine.core.models import UserModelCredential
from tests.support.api import JOBS, Harness, job_body, poll_until
from tests.support.runtimes import FAST_SETTINGS, MASTER_KEY, fast_registry

CREDENTIALS = '/api/ai/credentials'
USAGE = '/admin-api/ai/usage'
SECRET_KEY = 'sk-live-0123456789abcdefSECRET'


def test_register_list_and_delete_a_key_seeing_only_its_mask(keyed_api):
    created = keyed_api.a.post(CREDENTIALS, {'provider': 'deepseek', 'apiKey': SECRET_KEY})
    assert created.status == 201
    assert created.json['maskedKey'] == 'sk-...CRET' and created.json['provider'] == 'deepseek'
    row = UserModelCredential.get_by_id(created.json['credentialId'])
    assert SECRET_KEY not in row.encrypted_key and row.user_id == 'user-a'
    listed = keyed_api.a.get(CREDENTIALS)
    assert [item['credentialId'] for item in listed.json['items']] == [created.json['credentialId']]
    assert SECRET_KEY.encode() not in created.body + listed.body
    assert keyed_api.b.get(CREDENTIALS).json == {'items': []}

    not_yours = keyed_api.b.request('DELETE', CREDENTIALS + '/' + created.json['credentialId'])
    assert not_yours.status == 404 and not_yours.error_code == 'CREDENTIAL_NOT_FOUND'
    deleted = keyed_api.a.request('DELETE', CREDENTIALS + '/' + created.json['credentialId'])
    assert deleted.status == 204 and deleted.body == b''
    assert keyed_api.a.get(CREDENTIALS).json == {'items': []}
    again = keyed_api.a.request('DELETE', CREDENTIALS + '/' + created.json['credentialId'])
    assert again.status == 404


@pytest.mark.parametrize(
    'body,field',
    [
        ({'provider': 'Deep Seek', 'apiKey': SECRET_KEY}, 'provider'),
        ({'provider': 'deepseek', 'apiKey': ''}, 'apiKey'),
        ({'provider': 'deepseek', 'apiKey': SECRET_KEY, 'userId': 'user-b'}, 'userId'),
    ],
)
def test_invalid_credentials_are_400_naming_the_field(keyed_api, body, field):
    response = keyed_api.a.post(CREDENTIALS, body)
    assert response.status == 400 and response.json['error']['field'] == field
    assert SECRET_KEY.encode() not in response.body
    assert UserModelCredential.select().count() == 0


def test_without_a_master_key_registering_is_503(api):  # ``api`` has no master key
    response = api.a.post(CREDENTIALS, {'provider': 'deepseek', 'apiKey': SECRET_KEY})
    assert response.status == 503 and response.error_code == 'CREDENTIAL_STORAGE_UNAVAILABLE'
    assert UserModelCredential.select().count() == 0


def test_without_a_master_key_a_bad_body_is_still_400_first(api):
    response = api.a.post(CREDENTIALS, {'provider': 'deepseek'})
    assert response.status == 400 and response.json['error']['field'] == 'apiKey'


def test_admin_usage_totals_per_user_and_per_job_type(live_api):
    job_id = live_api.a.post(JOBS, job_body(input={'output': {'x': 1}})).json['jobId']
    poll_until(live_api.a, job_id, {'succeeded'})
    by_user = live_api.admin.get(USAGE)
    assert by_user.status == 200 and by_user.json['groupBy'] == 'user'
    assert [(t['userId'], t['calls']) for t in by_user.json['totals']] == [('user-a', 1)]
    by_type = live_api.admin.get(USAGE, query={'groupBy': 'jobType'}).json['totals']
    assert [(t['jobType'], t['calls'], t['errors']) for t in by_type] == [('synthetic', 1, 0)]
    empty = live_api.admin.get(
        USAGE, query={'since': '2000-01-01T00:00:00Z', 'until': '2000-01-02T00:00:00Z'}
    )
    assert empty.json['totals'] == []


@pytest.mark.parametrize(
    'query,field',
    [
        ({'groupBy': 'model'}, 'groupBy'),
        ({'since': 'last week'}, 'since'),
        ({'from': '2030-01-01'}, 'from'),
    ],
)
def test_admin_usage_rejects_bad_parameters(api, query, field):
    response = api.admin.get(USAGE, query=query)
    assert response.status == 400 and response.json['error']['field'] == field


def test_users_get_403_on_admin_usage(api):
    response = api.a.get(USAGE)
    assert response.status == 403 and response.error_code == 'FORBIDDEN'


@pytest.mark.slow
def test_logs_never_contain_input_output_tokens_or_keys(make_runtime, caplog):
    runtime = make_runtime(
        registry=fast_registry(), AIJOB_CREDENTIAL_MASTER_KEY=MASTER_KEY, **FAST_SETTINGS
    )
    marker = 'do-not-log-4f1c'
    quiet_sql_logging()  # as configure() does in every process
    with runtime.store.connection(), caplog.at_level(logging.DEBUG):
        harness = Harness(runtime)
        runtime.start_background()
        try:
            job_id = harness.a.post(
                JOBS, job_body(input={'text': marker, 'output': {'echo': marker}})
            ).json['jobId']
            poll_until(harness.a, job_id, {'succeeded'})
            harness.a.get(JOBS + '/%s/artifacts' % job_id)
            harness.a.post(CREDENTIALS, {'provider': 'deepseek', 'apiKey': SECRET_KEY})
            harness.a.post(
                JOBS, body=b'{"input": "' + marker.encode() + b'"', content_type='application/json'
            )
        finally:
            runtime.stop_background(timeout_s=5)
    lines = [JsonFormatter().format(record) for record in caplog.records]
    assert any('"http.request"' in line for line in lines)
    assert any(job_id in line for line in lines)  # job ids are logged
    for line in lines:
        for secret in [marker, SECRET_KEY] + list(harness.tokens.values()):
            assert secret not in line, line
