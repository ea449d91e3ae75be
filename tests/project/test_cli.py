"""``python aijob.py submit --wait`` and ``jobs`` as real processes against a real ``serve``:
success prints the artifacts and exits 0, failure prints the error and exits 1, Ctrl-C cancels
the job and exits 130 (without a terminal at once; on a terminal after asking, answered through
a pty). ``serve``'s own /metrics counts the jobs the CLI ran."""

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.http.auth import TokenStore
from tests.support.api import JOBS
from tests.support.fake_openai import json_reply
from tests.support.helpers import wait_until
from tests.support.paths import ROOT
from tests.support.servers import free_port

AIJOB = os.path.join(ROOT, 'aijob.py')
SLOW = {'sleepMs': 30000, 'progressSteps': 60}


def http_json(method, url, token):
    request = urllib.request.Request(
        url, method=method, headers={'Authorization': 'Bearer ' + token}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@contextlib.contextmanager
def serve(backend, make_runtime, tmp_path, **settings):
    """A real ``serve`` on a free port (with ``settings``); yields (url, its development admin
    token, a user's token)."""
    runtime = make_runtime()  # a clean store for this backend
    with runtime.store.connection():
        user_token = TokenStore(runtime.store).create('cli-user')
    port = free_port()
    env = dict(os.environ, **backend.env(AIJOB_PORT=str(port), **settings))
    proc = subprocess.Popen(
        [sys.executable, AIJOB, 'serve'],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        token = [proc.stdout.readline().strip() for _ in range(3)][-1]
        url = 'http://127.0.0.1:%d' % port

        def healthy():
            assert proc.poll() is None, 'serve exited with %s' % proc.returncode
            try:
                return http_json('GET', url + '/healthz', token)[0] == 200
            except OSError:
                return False

        wait_until(healthy, timeout=30, interval=0.1)
        yield url, token, user_token
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()


def cli(url, token, *args, **popen):
    env = dict(os.environ, AIJOB_URL=url, AIJOB_TOKEN=token)
    return subprocess.Popen([sys.executable, AIJOB] + list(args), env=env, **popen)


def submit(url, token, job_input, *extra):
    proc = cli(
        url,
        token,
        'submit',
        'synthetic',
        '--target',
        'note:1',
        '--input',
        json.dumps(job_input),
        *extra,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


def job_status(url, token, job_id):
    status, body = http_json('GET', '%s/api/ai/jobs/%s' % (url, job_id), token)
    assert status == 200, body
    return json.loads(body)


def counter(url, token, name, **labels):
    status, body = http_json('GET', url + '/metrics', token)
    assert status == 200
    for family in text_string_to_metric_families(body.decode('utf-8')):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@pytest.mark.slow
def test_submit_wait_prints_the_result_or_the_error_with_its_exit_code(
    backend, make_runtime, tmp_path
):
    with serve(backend, make_runtime, tmp_path) as (url, token, user_token):
        job_input = {'sleepMs': 600, 'progressSteps': 3, 'output': {'n': 7}}
        done = submit(url, token, job_input, '--wait')
        out, err = done.communicate(timeout=60)
        assert done.returncode == 0, err
        result = json.loads(out)
        assert result['lifecycleStatus'] == 'succeeded'
        assert [a['content'] for a in result['artifacts']] == [{'n': 7}]
        lines = err.splitlines()  # not a terminal: one plain line per change, no bar
        assert ' succeeded 100% ' in lines[-1], lines
        assert any(' running ' in line for line in lines) and '\r' not in err

        failed = submit(url, token, {'failWith': 'CONTENT_SAFETY_BLOCKED'}, '--wait')
        out, err = failed.communicate(timeout=60)
        assert failed.returncode == 1
        assert out == ''
        assert 'failed: CONTENT_SAFETY_BLOCKED: The content was blocked' in err

        created = submit(url, token, {})  # without --wait: the id, at once
        out, _ = created.communicate(timeout=60)
        assert created.returncode == 0
        job_id = out.strip()
        assert job_status(url, token, job_id)['jobType'] == 'synthetic'

        refused = submit(url, token, {'sleepMs': -1}, '--wait')
        _, err = refused.communicate(timeout=60)
        assert refused.returncode == 2 and 'INVALID_INPUT' in err

        listing = cli(url, token, 'jobs', stdout=subprocess.PIPE, text=True)
        table, _ = listing.communicate(timeout=60)
        assert listing.returncode == 0
        rows = table.splitlines()
        assert rows[0].split()[:3] == ['JOB', 'ID', 'TYPE']
        assert len(rows) == 1 + 3 and rows[1].startswith(job_id)  # newest first
        assert 'USER' in rows[0]  # an admin token sees the admin list
        own = cli(url, user_token, 'jobs', stdout=subprocess.PIPE, text=True)
        assert own.communicate(timeout=60)[0].strip() == 'no jobs'  # a user sees their own
        assert own.returncode == 0

        outcome = {'job_type': 'synthetic', 'queue': 'ai-interactive'}
        assert counter(url, token, 'aijob_jobs_created_total', **outcome) == 3
        succeeded = dict(outcome, outcome='succeeded')
        assert counter(url, token, 'aijob_jobs_finished_total', **succeeded) >= 1


@pytest.mark.slow
def test_submit_wait_stream_prints_the_text_as_it_arrives_then_the_artifacts(
    backend, make_runtime, tmp_path, fake
):
    cards = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}] * 5}
    text = json.dumps(cards)
    fake.script(json_reply(cards, chunks=40, delay_s=0.05))  # about 2 s of text
    provider = {
        'AIJOB_PROVIDER_BASE_URL': fake.base_url,
        'AIJOB_PLATFORM_API_KEY': 'sk-platform-cli-0000',
    }
    with serve(backend, make_runtime, tmp_path, **provider) as (url, token, _):
        job_input = json.dumps({'text': 'Paris is the capital of France.'})
        args = ['submit', 'flashcard_generation', '--target', 'note:1', '--input', job_input]
        proc = cli(url, token, *args, '--wait', '--stream', stdout=subprocess.PIPE)
        first = os.read(proc.stdout.fileno(), 10)  # the text's start (unbuffered: no byte lost)
        running = [job for job in jobs_of(url, token) if job['lifecycleStatus'] == 'running']
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert len(running) == 1  # the text came while the job ran
        out = (first + rest).decode('utf-8')
        assert out.startswith(text + '\n')
        result = json.loads(out[len(text) + 1 :])
        assert [a['content'] for a in result['artifacts']] == cards['cards']

        alone = submit(url, token, {}, '--stream')  # --stream follows: it needs --wait
        _, err = alone.communicate(timeout=60)
        assert alone.returncode == 2 and '--wait' in err


def jobs_of(url, token):
    status, body = http_json('GET', url + '/admin-api/ai/jobs', token)
    assert status == 200, body
    return json.loads(body)['items']


def wait_for_line(stream, text, timeout_s=30):
    """Read ``stream`` (a pipe of text) until a line holds ``text``."""
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = stream.readline()
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError('%r not seen in %r' % (text, seen))


def read_until(fd, text, timeout_s=30):
    """Read the pty's master side until ``text`` appeared; returns all that was read."""
    deadline = time.monotonic() + timeout_s
    seen = b''
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the other side closed
                break
            if text.encode() in seen:
                return seen.decode('utf-8', 'replace')
    raise AssertionError('%r not seen in %r' % (text, seen[-500:]))


@pytest.mark.slow
def test_ctrl_c_cancels_the_job_and_exits_130(backend, make_runtime, tmp_path):
    with serve(backend, make_runtime, tmp_path) as (url, token, user_token):
        # Not a terminal: cancel at once.
        proc = submit(url, token, SLOW, '--wait')
        lines = wait_for_line(proc.stderr, ' running ')
        job_id = lines[0].split()[1]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert 'interrupted: cancel requested for job %s' % job_id in err
        wait_until(
            lambda: job_status(url, token, job_id)['lifecycleStatus'] == 'cancelled', timeout=20
        )
        # A terminal (a pty): a progress bar; Ctrl-C asks, "y" cancels.
        ask_on_a_terminal_then_cancel(url, token)


def ask_on_a_terminal_then_cancel(url, token):
    master, slave = pty.openpty()
    proc = cli(
        url,
        token,
        'submit',
        'synthetic',
        '--target',
        'note:1',
        '--input',
        json.dumps(SLOW),
        '--wait',
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    try:
        screen = read_until(master, ' running ')
        assert '\r\x1b[K' in screen and '[' in screen and '%' in screen  # a bar, redrawn
        read_until(master, '#')  # progress moves the bar
        proc.send_signal(signal.SIGINT)
        screen = read_until(master, '[d]etach: ')
        job_id = screen.split('Cancel job ')[1].split('?')[0]
        os.write(master, b'y\n')
        screen = read_until(master, 'cancelled', timeout_s=30)
        assert proc.wait(30) == 130
        assert job_status(url, token, job_id)['lifecycleStatus'] == 'cancelled'
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_a_user_lists_only_their_own_jobs_newest_first(api):
    mine = [api.create(targetId='n%d' % i) for i in range(3)]
    api.create(client=api.b)
    page = api.a.get(JOBS, query={'limit': 2}).json
    assert [item['jobId'] for item in page['items']] == mine[::-1][:2]
    rest = api.a.get(JOBS, query={'limit': 2, 'cursor': page['nextCursor']}).json
    assert [item['jobId'] for item in rest['items']] == mine[:1] and rest['nextCursor'] is None
    assert api.a.get(JOBS, query={'lifecycleStatus': 'failed'}).json['items'] == []
    refused = api.a.get(JOBS, query={'userId': 'user-b'})
    assert refused.status == 400 and refused.error_code == 'INVALID_REQUEST'
    assert api.anon.get(JOBS).status == 401
