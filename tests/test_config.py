"""Configuration and the CLI's start-up: bad values fail with one clear line."""

import os
import subprocess
import sys

import pytest

from engine.core.config import Config
from engine.core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, 'aijob.py', *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_defaults_are_the_embedded_backends():
    config = Config.from_env({})
    assert config.database_url == 'sqlite:///aijob.db' and config.redis_url is None
    assert (config.lock_ttl_ms, config.heartbeat_ms, config.reap_after_ms) == (
        60_000,
        30_000,
        90_000,
    )
    assert (config.interactive_concurrency, config.background_concurrency) == (2, 1)


@pytest.mark.parametrize(
    'env',
    [
        {'AIJOB_DATABASE_URL': 'postgres://db/x'},
        {'AIJOB_DATABASE_URL': 'mysql://host-without-db'},
        {'AIJOB_REDIS_URL': 'http://nope'},
        {'AIJOB_LOCK_TTL_MS': 'soon'},
        {'AIJOB_INTERACTIVE_CONCURRENCY': '0'},
        {'AIJOB_DEFINITIONS': 'not a module'},
    ],
)
def test_bad_values_raise_a_config_error_naming_the_variable(env):
    with pytest.raises(ConfigError) as raised:
        Config.from_env(env)
    assert list(env)[0] in str(raised.value)


@pytest.mark.slow
def test_cli_prints_one_line_for_a_bad_setting():
    result = run_cli('initdb', AIJOB_DATABASE_URL='postgres://db/x')
    assert result.returncode == 2
    assert result.stderr.strip().count('\n') == 0
    assert 'AIJOB_DATABASE_URL' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.slow
def test_initdb_is_safe_to_run_twice(backend, tmp_path):
    env = backend.env()
    for _ in range(2):
        result = run_cli('initdb', **env)
        assert result.returncode == 0, result.stderr
        assert 'schema ready' in result.stdout


@pytest.mark.parametrize(
    'env,secret',
    [
        ({'AIJOB_DATABASE_URL': 'postgres://app:hunter2@db/x'}, 'hunter2'),
        ({'AIJOB_REDIS_URL': 'http://:hunter2@cache'}, 'hunter2'),
        ({'AIJOB_CREDENTIAL_MASTER_KEY': 'hunter2-not-base64!'}, 'hunter2'),
    ],
)
def test_an_invalid_secret_is_named_but_never_echoed(env, secret):
    with pytest.raises(ConfigError) as raised:
        Config.from_env(env)
    assert list(env)[0] in str(raised.value) and secret not in str(raised.value)
