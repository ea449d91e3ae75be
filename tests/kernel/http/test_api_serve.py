"""`python aijob.py serve` as a real process on a free port: a synthetic job runs to succeeded
over real HTTP, and the process stops cleanly on SIGTERM."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT
from tests.support.servers import free_port, http, wait_healthy
from tests.support.wsgi import OpenApiCheck

pytestmark = pytest.mark.slow


def test_serve_runs_a_synthetic_job_to_succeeded_over_real_http(backend, make_runtime, tmp_path):
    make_runtime()  # a clean store for this backend
    port = free_port()
    env = dict(os.environ, **backend.env(AIJOB_PORT=str(port)))
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'serve'],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        assert lines[0].startswith('aijob serving on http://127.0.0.1:%d' % port), lines
        token = lines[-1]
        base = 'http://127.0.0.1:%d' % port
        wait_healthy(base, proc)
        check = OpenApiCheck(http('GET', base + '/openapi.json').json)

        def call(method, path, body=None):
            response = http(method, base + path, token, body)
            check.check(method, path.split('?')[0], response)
            return response

        assert call('GET', '/readyz').status == 200
        created = call(
            'POST',
            '/api/ai/jobs',
            {
                'jobType': 'synthetic',
                'targetType': 'note',
                'targetId': 'n1',
                'input': {'sleepMs': 100, 'output': {'answer': 42}},
            },
        )
        assert created.status == 201
        job_id = created.json['jobId']
        deadline = time.monotonic() + 20
        status = created.json
        while status['lifecycleStatus'] not in ('succeeded', 'failed', 'cancelled'):
            assert time.monotonic() < deadline, status
            status = call('GET', '/api/ai/jobs/%s?waitMs=2000' % job_id).json
        assert status['lifecycleStatus'] == 'succeeded'
        artifacts = call('GET', '/api/ai/jobs/%s/artifacts' % job_id).json['artifacts']
        assert [a['content'] for a in artifacts] == [{'answer': 42}]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()


def run_cli(backend, *args):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'aijob.py')] + list(args),
        env=dict(os.environ, **backend.env()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result


def test_token_create_prints_the_token_last_and_revoke_disables_it(backend, make_runtime):
    runtime = make_runtime()
    created = run_cli(backend, 'token', 'create', '--user', 'carol', '--admin')
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    with runtime.store.connection():
        from engine.http.auth import TokenStore

        principal = TokenStore(runtime.store).authenticate(token)
        assert (principal.user_id, principal.role) == ('carol', 'SUPER_ADMIN')
        assert run_cli(backend, 'token', 'revoke', token).returncode == 0
        assert TokenStore(runtime.store).authenticate(token) is None
    assert run_cli(backend, 'token', 'revoke', token).returncode == 1  # already revoked
    assert run_cli(backend, 'token', 'create', '--user', 'has space').returncode == 2


def test_web_serves_the_api_from_several_workers(backend, make_runtime, tmp_path):
    runtime = make_runtime()
    with runtime.store.connection():
        from engine.http.auth import TokenStore

        token = TokenStore(runtime.store).create('dave')
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, 'aijob.py'),
            'web',
            '--port',
            str(port),
            '--workers',
            '2',
        ],
        cwd=str(tmp_path),
        env=dict(os.environ, **backend.env()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = 'http://127.0.0.1:%d' % port
        wait_healthy(base, proc)
        created = http(
            'POST',
            base + '/api/ai/jobs',
            token,
            {'jobType': 'synthetic', 'targetType': 'note', 'targetId': 'n1', 'input': {}},
        )
        assert created.status == 201
        for _ in range(4):  # whichever worker answers, same answer
            status = http('GET', base + '/api/ai/jobs/' + created.json['jobId'], token)
            assert status.status == 200 and status.json['jobId'] == created.json['jobId']
        assert http('GET', base + '/api/ai/jobs/' + created.json['jobId']).status == 401
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_importing_aijob_opens_nothing_until_gunicorn_asks_for_app(tmp_path):
    database = tmp_path / 'lazy.db'
    code = (
        'import os, aijob; assert not os.path.exists(%r); '
        'app = aijob.app; assert callable(app) and aijob.app is app; '
        'print(os.path.exists(%r))' % (str(database), str(database))
    )
    result = subprocess.run(
        [sys.executable, '-c', code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, AIJOB_DATABASE_URL='sqlite:///%s' % database, AIJOB_REDIS_URL=''),
    )
    assert result.returncode == 0, result.stderr


def raw_request(port, data):
    """Send raw bytes, read the whole answer: (status, headers text, body bytes)."""
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b''.join(chunks).partition(b'\r\n\r\n')
    return int(head.split()[1]), head.decode('latin-1'), body


def test_requests_gunicorn_refuses_are_answered_with_json_errors(tmp_path):
    port = free_port()
    env = dict(os.environ, AIJOB_PORT=str(port), AIJOB_DATABASE_URL='sqlite:///aijob.db')
    env.pop('AIJOB_REDIS_URL', None)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'serve'],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy('http://127.0.0.1:%d' % port, proc)
        cases = {
            b'GET /' + b'a' * 9000 + b' HTTP/1.1\r\nHost: x\r\n\r\n': (414, 'URI_TOO_LONG'),
            b'GET / HTTP/1.1\r\nHost: x\r\nX-Big: ' + b'b' * 9000 + b'\r\n\r\n': (
                431,
                'HEADERS_TOO_LARGE',
            ),
            b'NOT A REQUEST\r\n\r\n': (400, 'INVALID_REQUEST'),
        }
        for data, (status, code) in cases.items():
            got, head, body = raw_request(port, data)
            assert got == status and 'application/json' in head.lower(), head
            assert json.loads(body)['error']['code'] == code
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
