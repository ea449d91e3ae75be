"""Push with no configuration and a clean start (issue 24, items 4 and 5): ``serve`` from an empty
directory keeps a development master key beside its SQLite database, so a webhook registered
with only the two development flags receives a signed delivery; ``web`` and ``worker`` refuse
to start without a key the store needs; and no command prints a warning when it starts."""

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from engine.core import master_key
from engine.core.errors import ConfigError
from engine.extensions import load_config
from engine.runtime import Runtime
from tests.features.webhooks.test_webhooks import readme_verify
from tests.support.backends import REDIS_URL, RUN_PREFIX, delete_redis_keys, require_servers
from tests.support.paths import ROOT
from tests.support.runtimes import MASTER_KEY
from tests.support.servers import free_port, healthy, http, wait_for

AIJOB = os.path.join(ROOT, 'aijob.py')
DEV_FLAGS = {'AIJOB_WEBHOOK_ALLOW_HTTP': '1', 'AIJOB_WEBHOOK_ALLOW_PRIVATE': '1'}


def clean_env(**settings):
    """The environment of a new user: no AIJOB_ setting at all, but ``settings``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith('AIJOB_')}
    env.update(settings)
    return env


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(40) == 0


# ---------------------------------------------------------------- serve, zero configuration
@pytest.mark.slow
def test_serve_from_a_clean_directory_delivers_a_signed_webhook_with_only_the_dev_flags(
    tmp_path, receiver
):
    port = free_port()
    out, err = open(tmp_path / 'stdout', 'w+'), open(tmp_path / 'stderr', 'w+')
    proc = subprocess.Popen(
        [sys.executable, AIJOB, 'serve', '--port', str(port)],
        cwd=str(tmp_path),
        env=clean_env(**DEV_FLAGS),
        stdout=out,
        stderr=err,
    )
    base = 'http://127.0.0.1:%d' % port
    try:
        wait_for(healthy(base), proc)
        lines = (tmp_path / 'stdout').read_text().splitlines()
        token = lines[2]
        key_file = tmp_path / ('aijob.db' + master_key.SUFFIX)
        assert lines[3].endswith(': %s' % key_file), lines
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        created = http('POST', base + '/api/ai/webhooks', token, {'url': receiver.url})
        assert created.status == 201, created
        hook = created.json
        created = http(
            'POST',
            base + '/api/ai/jobs',
            token,
            {'jobType': 'synthetic', 'targetType': 'note', 'targetId': 'n1', 'input': {}},
        )
        assert created.status == 201, created
        job = created.json
        [(headers, body)] = receiver.wait_for(1, timeout=30)
    finally:
        stop(proc)
    assert readme_verify()(headers, body, hook['secret'])
    delivered = json.loads(body)
    assert (delivered['jobId'], delivered['lifecycleStatus']) == (job['jobId'], 'succeeded')
    printed = (tmp_path / 'stdout').read_text() + (tmp_path / 'stderr').read_text()
    assert key_file.read_text().strip() not in printed  # the path is shown, never the key
    assert [line for line in printed.splitlines() if 'Warning' in line] == []


def test_the_dev_key_is_made_once_readable_by_its_owner_only_and_kept(tmp_path):
    path = str(tmp_path / 'dev.db.master-key')
    key, made = master_key.load_or_create(path)
    assert made and len(key) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert master_key.load_or_create(path) == (key, False)  # the next start: the same key
    assert os.listdir(tmp_path) == ['dev.db.master-key']  # no draft left behind


def test_a_dev_key_file_without_a_key_stops_serve_saying_which_file(tmp_path):
    path = tmp_path / 'aijob.db.master-key'
    path.write_text('not a key\n')
    with pytest.raises(ConfigError, match='aijob.db.master-key is invalid'):
        master_key.load_or_create(str(path))


@pytest.mark.parametrize(
    'url,expected',
    [
        ('sqlite:///aijob.db', os.path.abspath('aijob.db') + '.master-key'),
        ('sqlite:////srv/data/jobs.db', '/srv/data/jobs.db.master-key'),
        ('sqlite:///:memory:', None),
        ('mysql://root@127.0.0.1:3306/test', None),
    ],
)
def test_the_dev_key_lives_beside_a_sqlite_file_only(url, expected):
    assert master_key.dev_key_path(url) == expected


# ---------------------------------------------------------------- web and worker: the operator's
def store_with_a_webhook(tmp_path):
    """A SQLite store (its URL) holding one webhook endpoint, made under a master key."""
    url = 'sqlite:///%s' % (tmp_path / 'prod.db')
    runtime = Runtime(
        load_config(clean_env(AIJOB_DATABASE_URL=url, AIJOB_CREDENTIAL_MASTER_KEY=MASTER_KEY))
    )
    try:
        runtime.create_schema()
        with runtime.store.connection():
            runtime.features['webhooks'].repository.create_endpoint(
                'u1', 'https://hooks.example.com/x'
            )
    finally:
        runtime.close()
    return url


@pytest.mark.slow
@pytest.mark.parametrize('command', ['web', 'worker'])
def test_web_and_worker_refuse_to_start_without_the_key_the_store_needs(tmp_path, command):
    if command == 'worker':
        require_servers('redis')
    url = store_with_a_webhook(tmp_path)
    env = clean_env(
        AIJOB_DATABASE_URL=url,
        AIJOB_REDIS_URL=REDIS_URL if command == 'worker' else '',
        AIJOB_REDIS_PREFIX=RUN_PREFIX + '-refuse',
    )
    args = ['--port', str(free_port())] if command == 'web' else []
    result = subprocess.run(
        [sys.executable, AIJOB, command] + args,
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith('aijob: error: AIJOB_CREDENTIAL_MASTER_KEY is not set'), line
    assert 'webhook endpoints' in line and master_key.GENERATE_MASTER_KEY in line
    assert not os.path.exists(str(tmp_path / 'prod.db') + master_key.SUFFIX)  # never made one


# ---------------------------------------------------------------- a clean start
@pytest.mark.slow
@pytest.mark.parametrize('command', ['serve', 'web', 'worker'])
def test_no_command_prints_a_warning_when_it_starts(tmp_path, command):
    """gevent patched before anything imported ssl: no MonkeyPatchWarning (nor any other)."""
    env = clean_env(AIJOB_PORT=str(free_port()))
    if command == 'worker':
        require_servers('redis')
        env.update(AIJOB_REDIS_URL=REDIS_URL, AIJOB_REDIS_PREFIX=RUN_PREFIX + '-clean-start')
    subprocess.run([sys.executable, AIJOB, 'initdb'], cwd=str(tmp_path), env=env, check=True)
    log = open(tmp_path / 'output', 'w+')
    proc = subprocess.Popen(
        [sys.executable, AIJOB, command], cwd=str(tmp_path), env=env, stdout=log, stderr=log
    )
    try:
        if command == 'worker':
            wait_for(lambda: 'worker.started' in (tmp_path / 'output').read_text(), proc)
        else:
            wait_for(healthy('http://127.0.0.1:%s' % env['AIJOB_PORT']), proc)
            if command == 'serve':
                wait_for(lambda: 'worker.started' in (tmp_path / 'output').read_text(), proc)
    finally:
        stop(proc)
        if command == 'worker':
            delete_redis_keys(RUN_PREFIX + '-clean-start')
    lines = (tmp_path / 'output').read_text().splitlines()
    assert lines, 'nothing printed'
    assert [line for line in lines if 'Warning' in line] == []
