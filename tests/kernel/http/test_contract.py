"""The contract in CI (issue 10, item 4): schemathesis against a live ``serve`` on both backend
pairs, once with a user's token over the user API and once with an admin token over the admin
API, with every check on: server errors, status codes, content types, headers and response
schemas not in the OpenAPI document, and drift both ways (ST201 a request outside the document
accepted, ST202 a request inside it refused). Zero failures; the summary is printed. The job
API runs again with each other credential of issue 33: a service key, the application's JWT and
a job's publicAccessToken.

Hooks (tests/support/contract_hooks.py) feed real ids into path parameters and cap long polls.
AIJOB_CONTRACT_EXAMPLES (cases per operation and phase) and AIJOB_CONTRACT_SEED tune a run; a
longer local run: AIJOB_CONTRACT_EXAMPLES=200 AIJOB_CONTRACT_SEED=$RANDOM."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import jwt
import pytest

from engine.http.auth import TokenStore
from tests.support.paths import ROOT
from tests.support.runtimes import MASTER_KEY, PROVIDER_SETTINGS
from tests.support.servers import serve_process  # noqa: F401

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get('AIJOB_CONTRACT_EXAMPLES', '10'))
SEED = os.environ.get('AIJOB_CONTRACT_SEED', '20261204')
# Every path of the document, HEAD and OPTIONS included: the user's API, the operations and the
# dashboard with a user's token, the admin API and the metrics with an admin token.
USER_API = r'^/(api/|healthz|readyz|openapi\.json|dashboard)'
ADMIN_API = r'^/(admin-api/|metrics)'
EVERY_PATH = r'^/'
JOB_API = r'^/api/ai/jobs'
JWT_SECRET = 'the-contract-applications-jwt-secret'


def call(server, method, path, token, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.base + path, data=data, method=method)
    request.add_header('Authorization', 'Bearer ' + token)
    if data is not None:
        request.add_header('Content-Type', 'application/json')
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b'null')


def known_ids(server, token):
    """One job, one stored key and one webhook of the user, for the hooks' path parameters."""
    job = call(
        server,
        'POST',
        '/api/ai/jobs',
        token,
        {'jobType': 'synthetic', 'targetType': 'note', 'targetId': 'n1', 'input': {}},
    )
    credential = call(
        server, 'POST', '/api/ai/credentials', token, {'provider': 'openai', 'apiKey': 'sk-test'}
    )
    webhook = call(server, 'POST', '/api/ai/webhooks', token, {'url': 'https://127.0.0.1/hook'})
    ids = {
        'jobId': [job['jobId']],
        'credentialId': [credential['credentialId']],
        'webhookId': [webhook['webhookId']],
    }
    return ids, job['publicAccessToken']


def schemathesis(server, token, operations, ids, folder, options=False, role='user'):
    """One run over the operations whose path matches ``operations``: every method but OPTIONS,
    all phases; or, with ``options``, OPTIONS alone and no stateful phase (OPTIONS describes a
    path, not a resource: it answers the same after a DELETE, which the stateful check of a
    deleted resource would take for one still there)."""
    # This interpreter's schemathesis (requirements.txt), whatever PATH holds.
    args = [
        sys.executable,
        '-m',
        'schemathesis.cli',
        'run',
        server.base + '/openapi.json',
        '--header',
        'Authorization: Bearer ' + token,
        '--include-path-regex',
        operations,
        # The regex form: an exact --include-method is or-ed with the path's regex (every
        # operation again, not OPTIONS alone); the regexes are and-ed.
        '--include-method-regex' if options else '--exclude-method-regex',
        '^OPTIONS$',
        '--checks',
        'all',
        '--max-examples',
        str(EXAMPLES),
        '--seed',
        SEED,
        '--generation-database',
        'none',
        '--request-timeout',
        '10',
        '--no-color',
        '--continue-on-failure',
        # A clock's verdict on the generator, not on the server: under a loaded machine (the
        # suite's parallel processes) it failed a run whose every case passed.
        '--suppress-health-check=too_slow',
    ]
    if options:
        args += ['--phases', 'examples,coverage,fuzzing']
    env = dict(
        os.environ,
        SCHEMATHESIS_HOOKS='tests.support.contract_hooks',
        AIJOB_CONTRACT_IDS=json.dumps(ids),
        AIJOB_CONTRACT_ROLE=role,
        PYTHONPATH=ROOT,
    )
    result = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    summary = result.stdout[result.stdout.rfind('SUMMARY') :]
    print(re.sub(r'\n\s*\n', '\n', summary))
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-3000:]
    return summary


# The runs, each a test of its own on a server of its own, so that a parallel run (xdist) can
# spread them: which credential, which paths, and OPTIONS alone or every other method.
RUNS = {
    'user': ('user', USER_API, False),
    'admin': ('admin', ADMIN_API, False),
    'options': ('user', EVERY_PATH, True),
    'service': ('service', JOB_API, False),
    'jwt': ('jwt', JOB_API, False),
    'job': ('job', JOB_API, False),
}


@pytest.mark.parametrize('run', sorted(RUNS))
def test_the_server_matches_its_openapi_document(
    backend,
    make_runtime,
    serve_process,  # noqa: F811
    tmp_path,
    run,
):
    runtime = make_runtime()
    with runtime.store.connection():
        tokens = TokenStore(runtime.store)
        user, admin = tokens.create('contract-user'), tokens.create('contract-admin', admin=True)
        service = tokens.create('contract-app', role='service')
    app_jwt = jwt.encode(
        {'sub': 'contract-user', 'exp': int(time.time()) + 3600}, JWT_SECRET, algorithm='HS256'
    )
    server = serve_process(
        backend.env(
            AIJOB_CREDENTIAL_MASTER_KEY=MASTER_KEY,
            AIJOB_WEBHOOK_ALLOW_PRIVATE='1',
            AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
            AIJOB_DAILY_JOB_QUOTA='0',
            AIJOB_SHUTDOWN_GRACE_MS='2000',
            AIJOB_JWT_SECRET=JWT_SECRET,
            AIJOB_CORS_ORIGINS='https://app.example.com',
            **PROVIDER_SETTINGS,
        )
    )
    ids, job_token = known_ids(server, user)
    role, operations, options = RUNS[run]
    credentials = {'user': user, 'admin': admin, 'service': service, 'jwt': app_jwt}
    credentials['job'] = job_token
    schemathesis(server, credentials[role], operations, ids, tmp_path, options, role)
    assert server.stop() == 0, server.log_path.read_text()[-5000:]
