"""The API tests' fixtures (``api``, ``keyed_api``, ``live_api``) and helpers: the app over a test
runtime, tokens for two users and an admin, and clients that check every response against
/openapi.json."""

import time

import pytest

from engine.core.errors import InternalJobError
from engine.core.fences import Fence
from engine.core.states import TERMINAL
from engine.http.app import create_app
from engine.http.auth import TokenStore
from tests.support.runtimes import FAST_SETTINGS, fast_registry
from tests.support.wsgi import OpenApiCheck, WsgiClient

JOBS = '/api/ai/jobs'
ADMIN_JOBS = '/admin-api/ai/jobs'


def job_body(key=None, **overrides):
    body = {'jobType': 'synthetic', 'targetType': 'note', 'targetId': 'note-1', 'input': {}}
    if key is not None:
        body['idempotencyKey'] = key
    body.update(overrides)
    return body


class Harness:
    """The app and one client per caller: ``a`` and ``b`` (users), ``admin``, ``anon``."""

    def __init__(self, runtime, app=None):
        self.runtime = runtime
        self.app = app or create_app(runtime)
        self.check = OpenApiCheck(self.app_document())
        tokens = TokenStore(runtime.store)
        self.tokens = {
            'a': tokens.create('user-a'),
            'b': tokens.create('user-b'),
            'admin': tokens.create('root', admin=True),
        }
        self.a, self.b, self.admin = (
            self.client(self.tokens[name]) for name in ('a', 'b', 'admin')
        )
        self.anon = self.client(None)

    def app_document(self):
        return WsgiClient(self.app).get('/openapi.json').json

    def client(self, token):
        return WsgiClient(self.app, token, self.check)

    def create(self, client=None, **kw):
        response = (client or self.a).post(JOBS, job_body(**kw))
        assert response.status == 201, response
        return response.json['jobId']


@pytest.fixture
def api(runtime):
    """The API over the default runtime (no provider, no credential master key)."""
    return Harness(runtime)


@pytest.fixture
def keyed_api(keyed_runtime):
    """The API over ``keyed_runtime``: users may register provider keys."""
    return Harness(keyed_runtime)


# ---------------------------------------------------------------- driving the state machine
# Without workers, tests move jobs along the real lifecycle repository (the only writer of
# lifecycle_status), the way a worker would.
def run_to_running(runtime, job_id, instance='test-worker'):
    job = runtime.lifecycle.lock_job(job_id, instance)
    return Fence(instance, job.attempt_no)


def run_to_failed(runtime, job_id, internal='provider said 500 at https://internal.example/v1'):
    fence = run_to_running(runtime, job_id)
    error = InternalJobError(
        internal, code='PROVIDER_UNAVAILABLE', public_message='The AI provider is unavailable.'
    )
    runtime.lifecycle.mark_failed(job_id, error, fence=fence)
    return runtime.lifecycle.get(job_id)


# ---------------------------------------------------------------- with the engine running
@pytest.fixture
def live_api(make_runtime):
    """The API over a runtime whose dispatcher and worker pools run in this process."""
    runtime = make_runtime(registry=fast_registry(), **FAST_SETTINGS)
    with runtime.store.connection():
        harness = Harness(runtime)
        runtime.start_background()
        try:
            yield harness
        finally:
            runtime.stop_background(timeout_s=5)


def poll_until(client, job_id, statuses, timeout_s=20.0):
    """Long-poll the status endpoint until the job is in one of ``statuses``."""
    deadline = time.monotonic() + timeout_s
    etag = None
    while time.monotonic() < deadline:
        # The first read takes the state as it is; later ones wait for a change from it.
        headers = {'If-None-Match': etag} if etag else {}
        query = {'waitMs': 2000} if etag else {}
        response = client.get(JOBS + '/' + job_id, query=query, headers=headers)
        if response.status == 200:
            etag = response.headers['etag']
            if response.json['lifecycleStatus'] in statuses:
                return response.json
            assert response.json['lifecycleStatus'] not in TERMINAL, response.json
    raise AssertionError('job %s did not reach %s in %.0fs' % (job_id, statuses, timeout_s))
