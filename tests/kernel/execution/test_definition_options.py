"""Every definition option and setting does what it says (or is gone): ``cancellable``, snapshot
expiry and outbox retention, the public error codes, the credential creation body."""

import dataclasses
import io
import json

from engine.core.models import AiJob
from engine.core.registry import JobDefinitionRegistry
from engine.core.service import CreateJobInput
from engine.http.app import create_app
from engine.http.auth import TokenStore
from engine.jobtypes.synthetic import synthetic_definition


def create_job(runtime, job_type='synthetic', user_id='user-a'):
    request = CreateJobInput(user_id, job_type, 'note', 'note-1', input={})
    return runtime.service.create_job(request).job


def call(app, method, path, token=None, body=None):
    """One WSGI request; returns (status code, JSON body)."""
    data = json.dumps(body).encode('utf-8') if body is not None else b''
    environ = {
        'REQUEST_METHOD': method,
        'PATH_INFO': path,
        'QUERY_STRING': '',
        'SERVER_NAME': 'test',
        'SERVER_PORT': '80',
        'wsgi.url_scheme': 'http',
        'wsgi.input': io.BytesIO(data),
        'CONTENT_LENGTH': str(len(data)),
        'CONTENT_TYPE': 'application/json',
    }
    if token:
        environ['HTTP_AUTHORIZATION'] = 'Bearer ' + token
    started = {}

    def start_response(status, headers, exc_info=None):
        started['status'] = int(status.split()[0])

    chunks = b''.join(app(environ, start_response))
    return started['status'], json.loads(chunks) if chunks else None


def uncancellable_registry():
    definition = synthetic_definition(job_type='synthetic_pinned')
    definition = dataclasses.replace(
        definition, execution=dataclasses.replace(definition.execution, cancellable=False)
    )
    registry = JobDefinitionRegistry()
    registry.register(synthetic_definition())
    registry.register(definition)
    return registry


# ---------------------------------------------------------------- 1. cancellable: False
def test_cancel_of_an_uncancellable_job_is_409_and_writes_nothing(make_runtime):
    runtime = make_runtime(registry=uncancellable_registry())
    with runtime.store.connection():
        app = create_app(runtime)
        token = TokenStore(runtime.store).create('user-a')
        job = create_job(runtime, job_type='synthetic_pinned')
        before = AiJob.select().where(AiJob.id == job.id).dicts().get()
        status, body = call(app, 'POST', '/api/ai/jobs/%s/cancel' % job.id, token)
        assert status == 409
        assert body['error']['code'] == 'JOB_NOT_CANCELLABLE'
        assert AiJob.select().where(AiJob.id == job.id).dicts().get() == before
        # a cancellable job of the same runtime still cancels
        other = create_job(runtime)
        status, body = call(app, 'POST', '/api/ai/jobs/%s/cancel' % other.id, token)
        assert status == 200 and body['lifecycleStatus'] == 'cancelled'


# ---------------------------------------------------------------- 2. no output redaction option
def test_security_policy_has_no_output_redaction():
    from engine.core.registry import SecurityPolicy

    assert [f.name for f in dataclasses.fields(SecurityPolicy)] == ['content_safety_check']
