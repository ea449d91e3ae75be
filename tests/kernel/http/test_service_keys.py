"""Service keys (issue 33, item 1), on both backend pairs: a key of role ``service`` creates a
job for an end user (``userId``), and the job is that user's in every respect (ownership,
admission limits, budgets, the response cache's user scope, usage); the history's ``created``
row names the service; a service may read, follow, cancel and list one user's jobs, and nothing
of a user's own or an admin's; a user's token that sets ``userId`` stays 400. The admin tokens
API (issue all roles, list masked, revoke) and ``token create --service``."""

import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from engine.core.history import JobHistory
from engine.core.models import AiJob, AiUsageLog, ApiToken
from engine.http.auth import TokenStore
from tests.features.budgets.test_budgets import budget_rt, put, record_cost  # noqa: F401
from tests.features.cache.test_cache import TEXT, USER_TYPE, start  # noqa: F401
from tests.features.cache.test_cache import wait_terminal as wait_card_job
from tests.kernel.http.test_jwt import AUDIENCE, ISSUER, SECRET, claims
from tests.support import paths
from tests.support.api import JOBS, Harness, job_body
from tests.support.helpers import wait_until

TOKENS = '/admin-api/ai/tokens'
ROOT = Path(paths.ROOT)


def with_service(harness, name='shop'):
    """The harness with ``harness.svc``, a client holding a service key named ``name``."""
    harness.tokens['svc'] = TokenStore(harness.runtime.store).create(name, role='service')
    harness.svc = harness.client(harness.tokens['svc'])
    return harness


@pytest.fixture
def svc_api(api):
    return with_service(api)


def create_for(harness, user_id, **kw):
    response = harness.svc.post(JOBS, job_body(userId=user_id, **kw))
    assert response.status == 201, response
    return response.json


# ---------------------------------------------------------------- ownership
def test_a_service_creates_a_job_that_is_the_users_and_names_the_service(svc_api):
    job = create_for(svc_api, 'user-a', input={'sleepMs': 1})
    row = AiJob.get_by_id(job['jobId'])
    assert row.user_id == 'user-a'
    # The user reads it with their own token; another user does not even learn it exists.
    assert svc_api.a.get(JOBS + '/' + job['jobId']).status == 200
    assert [j['jobId'] for j in svc_api.a.get(JOBS).json['items']] == [job['jobId']]
    hidden = svc_api.b.get(JOBS + '/' + job['jobId'])
    assert hidden.status == 404 and hidden.error_code == 'JOB_NOT_FOUND'
    [created] = [e for e in JobHistory(svc_api.runtime.store).list(row.id) if e.kind == 'created']
    assert created.detail['service'] == 'shop'
    events = svc_api.a.get(JOBS + '/' + job['jobId'] + '/events').json['events']
    assert events[0]['kind'] == 'created' and events[0]['detail']['service'] == 'shop'


def test_a_services_job_is_read_with_its_users_jwt_and_hidden_from_anothers(make_runtime):
    """The job a service key created for an end user is that user's under the application's
    own credentials too: the JWT whose sub is the user reads and lists it, another user's JWT
    gets 404 as for any job not its own."""
    rt = make_runtime(AIJOB_JWT_SECRET=SECRET, AIJOB_JWT_ISSUER=ISSUER, AIJOB_JWT_AUDIENCE=AUDIENCE)
    with rt.store.connection():
        harness = with_service(Harness(rt))
        job_id = create_for(harness, 'app-user-7')['jobId']
        owner = harness.client(jwt.encode(claims(sub='app-user-7'), SECRET, algorithm='HS256'))
        stranger = harness.client(jwt.encode(claims(sub='app-user-8'), SECRET, algorithm='HS256'))

        read = owner.get(JOBS + '/' + job_id)
        assert read.status == 200 and read.json['jobId'] == job_id, read
        assert owner.get(JOBS + '/' + job_id + '/events').status == 200
        assert [j['jobId'] for j in owner.get(JOBS).json['items']] == [job_id]
        for path in (JOBS + '/' + job_id, JOBS + '/' + job_id + '/events'):
            hidden = stranger.get(path)
            assert hidden.status == 404 and hidden.error_code == 'JOB_NOT_FOUND', hidden
        assert stranger.get(JOBS).json['items'] == []


def test_a_service_reads_cancels_and_lists_one_users_jobs(svc_api):
    mine = create_for(svc_api, 'user-a')['jobId']
    theirs = svc_api.create(svc_api.b)  # created by user-b's own token
    for job_id in (mine, theirs):
        assert svc_api.svc.get(JOBS + '/' + job_id).status == 200
        assert svc_api.svc.get(JOBS + '/' + job_id + '/events').status == 200
        assert svc_api.svc.get(JOBS + '/' + job_id + '/artifacts').status == 200
    listed = svc_api.svc.get(JOBS, query={'userId': 'user-b'})
    assert [j['jobId'] for j in listed.json['items']] == [theirs]
    missing = svc_api.svc.get(JOBS)
    assert missing.status == 400 and missing.json['error']['field'] == 'userId'
    cancelled = svc_api.svc.post(JOBS + '/' + theirs + '/cancel')
    assert cancelled.status == 200 and cancelled.json['lifecycleStatus'] == 'cancelled'


def test_a_service_needs_a_good_user_id_and_a_user_may_not_set_one(svc_api):
    before = AiJob.select().count()
    for body in (job_body(), job_body(userId=''), job_body(userId='a b'), job_body(userId=7)):
        refused = svc_api.svc.post(JOBS, body)
        assert refused.status == 400 and refused.json['error']['field'] == 'userId', refused
    for client in (svc_api.a, svc_api.admin):
        refused = client.post(JOBS, job_body(userId='user-b'))
        assert refused.status == 400 and refused.json['error']['field'] == 'userId'
    refused = svc_api.a.get(JOBS, query={'userId': 'user-b'})
    assert refused.status == 400
    assert AiJob.select().count() == before


@pytest.mark.parametrize(
    'method, path',
    [
        ('GET', '/api/ai/credentials'),
        ('GET', '/api/ai/webhooks'),
        ('GET', '/admin-api/ai/jobs'),
        ('GET', '/admin-api/ai/budgets'),
        ('GET', TOKENS),
        ('GET', '/admin-api/ai/usage'),
    ],
)
def test_a_service_is_no_user_and_no_admin(svc_api, method, path):
    refused = svc_api.svc.request(method, path)
    assert refused.status == 403 and refused.error_code == 'FORBIDDEN', refused


def test_a_services_waits_and_streams_count_against_each_jobs_user(make_runtime):
    """One application server follows many users' jobs: its long polls and event streams
    count against each job's user's cap, not all against the service's."""
    api = with_service(Harness(make_runtime(AIJOB_MAX_STREAMS_PER_USER='1')))
    first, second = (create_for(api, user)['jobId'] for user in ('u-1', 'u-2'))
    opened = [
        api.svc.request('GET', JOBS + '/%s/stream' % job_id, stream=True)
        for job_id in (first, second)
    ]
    try:
        assert [response.status for response in opened] == [200, 200]
        refused = api.svc.get(JOBS + '/%s/stream' % first)  # u-1's one stream is open
        assert (refused.status, refused.error_code) == (429, 'TOO_MANY_STREAMS')
    finally:
        for response in opened:
            response.close()


# ---------------------------------------------------------------- the user's limits
def test_the_users_admission_limit_applies_not_the_services(make_runtime):
    harness = with_service(Harness(make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='1')))
    with harness.runtime.store.connection():
        create_for(harness, 'user-a')
        refused = harness.svc.post(JOBS, job_body(userId='user-a'))
        assert refused.status == 429 and refused.error_code == 'TOO_MANY_JOBS'
        # user-a's own token meets the same count; another user of the service does not.
        assert harness.a.post(JOBS, job_body()).error_code == 'TOO_MANY_JOBS'
        create_for(harness, 'user-b')


def test_the_users_budget_applies_not_the_services(budget_rt):  # noqa: F811
    harness = with_service(Harness(budget_rt))
    record_cost('user-a', '2')
    assert put(harness.admin, scope='user', subject='user-a', period='day', amount='2').json
    budget_rt.features['budgets'].forget()
    refused = harness.svc.post(JOBS, job_body(userId='user-a'))
    assert refused.status == 429 and refused.error_code == 'BUDGET_EXCEEDED'
    assert 'user user-a budget' in refused.json['error']['message']
    create_for(harness, 'user-b')


def test_the_cache_scope_and_the_usage_are_the_users(start, fake):  # noqa: F811
    runtime = start()
    with runtime.store.connection():
        harness = with_service(Harness(runtime))
        body = {'text': TEXT, 'maxCards': 3}
        first = create_for(harness, 'user-a', jobType=USER_TYPE, input=body)['jobId']
        assert wait_card_job(first).lifecycle_status == 'succeeded'
        # user-a's own job with the same input hits the entry the service's job wrote...
        own = harness.a.post(JOBS, job_body(jobType=USER_TYPE, input=body)).json['jobId']
        assert wait_card_job(own).lifecycle_status == 'succeeded'
        # ...and the same service's job for user-b does not.
        other = create_for(harness, 'user-b', jobType=USER_TYPE, input=body)['jobId']
        assert wait_card_job(other).lifecycle_status == 'succeeded'
        assert len(fake.requests) == 2
        rows = {row.job_id: row for row in AiUsageLog.select()}
        assert (rows[first].user_id, rows[first].cached) == ('user-a', False)
        assert (rows[own].user_id, rows[own].cached) == ('user-a', True)
        assert rows[other].user_id == 'user-b'


# ---------------------------------------------------------------- the admin tokens API
def test_an_admin_issues_lists_and_revokes_tokens_of_every_role(api):
    issued = {}
    for role, name in (('user', 'user-c'), ('service', 'shop'), ('SUPER_ADMIN', 'root-2')):
        response = api.admin.post(TOKENS, {'role': role, 'name': name})
        assert response.status == 201, response
        body = response.json
        assert (body['role'], body['name']) == (role, name)
        assert body['token'].startswith(body['tokenHint'].rstrip('…'))
        issued[role] = body
    # Shown once: the store keeps its hash only, and the list never shows it.
    for body in issued.values():
        assert not ApiToken.select().where(ApiToken.token_hash == body['token']).exists()
    listed = api.admin.get(TOKENS).json['items']
    assert all('token' not in item for item in listed)
    assert {(i['role'], i['name']) for i in listed} >= {('service', 'shop'), ('user', 'user-c')}
    # Each works in its role, and its use shows in the list.
    shop = api.client(issued['service']['token'])
    assert shop.post(JOBS, job_body(userId='user-c')).status == 201
    assert api.client(issued['user']['token']).get(JOBS).json['items'][0]['jobType']
    used = {i['tokenId']: i for i in api.admin.get(TOKENS).json['items']}
    assert used[issued['service']['tokenId']]['lastUsedAt'] is not None
    # Revoked: gone from the list, refused (after the one-second cache), 404 a second time.
    token_id = issued['service']['tokenId']
    assert api.admin.request('DELETE', TOKENS + '/' + token_id).status == 204
    assert token_id not in {i['tokenId'] for i in api.admin.get(TOKENS).json['items']}
    wait_until(lambda: shop.get(JOBS, query={'userId': 'user-c'}).status == 401, timeout=5)
    again = api.admin.request('DELETE', TOKENS + '/' + token_id)
    assert again.status == 404 and again.error_code == 'TOKEN_NOT_FOUND'


def test_the_token_list_pages_and_users_may_not_use_it(api):
    page = api.admin.get(TOKENS, query={'limit': 1})
    assert len(page.json['items']) == 1 and page.json['nextAfter'] is not None
    rest = api.admin.get(TOKENS, query={'after': page.json['nextAfter'], 'limit': 1000})
    assert len(rest.json['items']) == 2 and rest.json['nextAfter'] is None  # a, b, admin
    assert api.a.get(TOKENS).status == 403
    assert api.a.post(TOKENS, {'role': 'SUPER_ADMIN', 'name': 'me'}).status == 403
    for body, field in (
        ({'role': 'owner', 'name': 'x'}, 'role'),
        ({'role': 'user', 'name': 'a b'}, 'name'),
        ({'role': 'user'}, 'name'),
        ({'role': 'user', 'name': 'x', 'scope': 'all'}, 'scope'),
    ):
        refused = api.admin.post(TOKENS, body)
        assert refused.status == 400 and refused.json['error']['field'] == field, refused


def test_last_use_is_written_at_most_once_a_minute(runtime):
    tokens = TokenStore(runtime.store)
    token = tokens.create('user-a')
    assert tokens.authenticate(token) is not None
    first = ApiToken.get(ApiToken.user_id == 'user-a').last_used_at
    assert first is not None
    tokens._cache.clear()  # past the one-second cache, well within the minute
    other = TokenStore(runtime.store)  # another process: its UPDATE finds the row recent
    assert tokens.authenticate(token) is not None and other.authenticate(token) is not None
    assert ApiToken.get(ApiToken.user_id == 'user-a').last_used_at == first


@pytest.mark.slow
def test_token_create_service_prints_a_service_key(backend, make_runtime):
    runtime = make_runtime()  # the schema, on this backend
    env = dict(os.environ, **backend.env())
    args = [sys.executable, str(ROOT / 'aijob.py'), 'token', 'create']
    made = subprocess.run(args + ['--service', 'shop'], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert 'service shop (role service)' in made.stdout
    token = made.stdout.strip().splitlines()[-1]
    with runtime.store.connection():
        harness = Harness(runtime)
        assert harness.client(token).post(JOBS, job_body(userId='user-a')).status == 201
    both = subprocess.run(
        args + ['--service', 'shop', '--user', 'u'], env=env, capture_output=True, text=True
    )
    assert both.returncode == 2 and 'either' in both.stderr


def test_initdb_adds_the_new_token_columns_to_an_older_deployment(runtime):
    """An api_token table from before issue 33 (no last use, no hint) is upgraded in place by
    initdb, and its tokens keep working."""
    token = TokenStore(runtime.store).create('user-old')
    for column in ('last_used_at', 'token_hint'):
        runtime.store.db.execute_sql('ALTER TABLE api_token DROP COLUMN %s' % column)
    runtime.store.create_schema()  # initdb
    columns = {c.name for c in runtime.store.db.get_columns('api_token')}
    assert {'last_used_at', 'token_hint'} <= columns
    assert TokenStore(runtime.store).authenticate(token).user_id == 'user-old'
    harness = Harness(runtime)
    [old] = [t for t in harness.admin.get(TOKENS).json['items'] if t['name'] == 'user-old']
    assert old['tokenHint'] is None and old['lastUsedAt'] is not None
