"""The example plugin (examples/summarize.py) loaded as a user loads it: named in
AIJOB_DEFINITIONS for real `initdb` and `serve` processes, a job created over HTTP runs against
the loopback OpenAI-compatible server, and its summary lands in the plugin's own table."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from examples.summarize import Summary
from tests.support.fake_openai import json_reply
from tests.support.paths import ROOT
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

TEXT = 'The tortoise won the race because the hare, sure of winning, stopped to sleep.'


def call(method, url, token, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header('Authorization', 'Bearer ' + token)
    if data is not None:
        request.add_header('Content-Type', 'application/json')
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_healthy(base, proc):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, 'serve exited with %s' % proc.returncode
        try:
            with urllib.request.urlopen(base + '/healthz', timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError('serve did not answer')


def test_a_plugin_job_type_runs_and_writes_its_own_table(backend, make_runtime, fake, tmp_path):
    port = free_port()
    env = dict(
        os.environ,
        **backend.env(
            AIJOB_DEFINITIONS='examples.summarize',
            AIJOB_PROVIDER_BASE_URL=fake.base_url,
            AIJOB_PROVIDER_MODEL='fake-model',
            AIJOB_PLATFORM_API_KEY='sk-example-plugin-test',
            AIJOB_PORT=str(port),
        ),
    )
    runtime = make_runtime(AIJOB_DEFINITIONS='examples.summarize')  # a clean store
    aijob = [sys.executable, os.path.join(ROOT, 'aijob.py')]
    subprocess.run(aijob + ['initdb'], env=env, cwd=tmp_path, check=True, timeout=60)
    fake.script(json_reply({'summary': 'Slow and steady wins: the hare slept.'}))
    proc = subprocess.Popen(
        aijob + ['serve'],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        token = [proc.stdout.readline().strip() for _ in range(3)][-1]
        base = 'http://127.0.0.1:%d' % port
        wait_healthy(base, proc)
        status, created = call(
            'POST',
            base + '/api/ai/jobs',
            token,
            {
                'jobType': 'summarize',
                'targetType': 'note',
                'targetId': 'fable-1',
                'input': {'text': TEXT, 'maxWords': 12},
            },
        )
        assert status == 201, created
        job_url = base + '/api/ai/jobs/' + created['jobId']
        deadline = time.monotonic() + 20
        job = created
        while job['lifecycleStatus'] in ('queued', 'running'):
            assert time.monotonic() < deadline, job
            job = call('GET', job_url + '?waitMs=2000', token)[1]
        assert job['lifecycleStatus'] == 'succeeded', job
        [artifact] = call('GET', job_url + '/artifacts', token)[1]['artifacts']
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
    assert artifact['artifactType'] == 'summary'
    with runtime.store.connection():
        row = Summary.get_by_id(artifact['artifactId'])
        assert (row.job_id, row.target_id) == (created['jobId'], 'fable-1')
        assert (row.summary, row.word_count) == ('Slow and steady wins: the hare slept.', 7)
        Summary.delete().where(Summary.job_id == row.job_id).execute()
    prompt = fake.requests[0]['messages'][-1]['content']
    assert 'at most 12 words' in prompt and TEXT in prompt
