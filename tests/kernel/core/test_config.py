"""Configuration and the CLI's start-up: bad values fail with one clear line."""

import os
import subprocess
import sys

import pytest

from engine.core.config import database_features
from engine.core.errors import ConfigError
from engine.extensions import load_config
from tests.support.paths import ROOT


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
    config = load_config({})
    assert config.database_url == 'sqlite:///aijob.db' and config.redis_url is None
    assert (config.lock_ttl_ms, config.heartbeat_ms, config.reap_after_ms) == (
        60_000,
        30_000,
        90_000,
    )
    assert (config.interactive_concurrency, config.background_concurrency) == (16, 16)  # auto
    assert (config.user_weights, config.max_running_per_user) == ({}, 0)  # plain turns, no cap


def test_concurrency_auto_is_a_thousand_with_redis_and_the_specifications_values_are_settings():
    redis = {'AIJOB_REDIS_URL': 'redis://127.0.0.1:6379/0'}
    config = load_config(redis)
    assert (config.interactive_concurrency, config.background_concurrency) == (1000, 1000)
    spec = {'AIJOB_INTERACTIVE_CONCURRENCY': '2', 'AIJOB_BACKGROUND_CONCURRENCY': 'AUTO'}
    config = load_config(dict(redis, **spec))
    assert (config.interactive_concurrency, config.background_concurrency) == (2, 1000)
    with pytest.raises(ConfigError, match='AIJOB_BACKGROUND_CONCURRENCY'):
        load_config({'AIJOB_BACKGROUND_CONCURRENCY': '0'})


def test_user_weights_are_whole_numbers_per_user():
    config = load_config({'AIJOB_USER_WEIGHTS': '{"big-tenant": 5, "u2": 1}'})
    assert config.user_weights == {'big-tenant': 5, 'u2': 1}


@pytest.mark.parametrize(
    'env',
    [
        {'AIJOB_DATABASE_URL': 'postgres://db/x'},
        {'AIJOB_DATABASE_URL': 'mysql://host-without-db'},
        {'AIJOB_REDIS_URL': 'http://nope'},
        {'AIJOB_LOCK_TTL_MS': 'soon'},
        {'AIJOB_INTERACTIVE_CONCURRENCY': '0'},
        {'AIJOB_DEFINITIONS': 'not a module'},
        {'AIJOB_USER_WEIGHTS': '[1, 2]'},
        {'AIJOB_USER_WEIGHTS': '{"u1": 0}'},
        {'AIJOB_USER_WEIGHTS': '{"u1": 2.5}'},
        {'AIJOB_USER_WEIGHTS': '{"u1": true}'},
        {'AIJOB_MAX_RUNNING_PER_USER': '-1'},
    ],
)
def test_bad_values_raise_a_config_error_naming_the_variable(env):
    with pytest.raises(ConfigError) as raised:
        load_config(env)
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
        load_config(env)
    assert list(env)[0] in str(raised.value) and secret not in str(raised.value)


@pytest.mark.parametrize(
    'env,names',
    [
        ({'AIJOB_HEARTBEAT_MS': '60000'}, ('AIJOB_HEARTBEAT_MS', 'AIJOB_LOCK_TTL_MS')),
        ({'AIJOB_LOCK_TTL_MS': '5000'}, ('AIJOB_HEARTBEAT_MS', 'AIJOB_LOCK_TTL_MS')),
        (
            {'AIJOB_LOCK_TTL_MS': '200000', 'AIJOB_HEARTBEAT_MS': '100000'},
            ('AIJOB_HEARTBEAT_MS', 'AIJOB_REAP_AFTER_MS'),
        ),
        (
            {'AIJOB_BATCH_POLL_FIRST_MS': '5000', 'AIJOB_BATCH_POLL_MAX_MS': '4999'},
            ('AIJOB_BATCH_POLL_FIRST_MS', 'AIJOB_BATCH_POLL_MAX_MS'),
        ),
        (
            {'AIJOB_STREAM_HEARTBEAT_MS': '20000', 'AIJOB_STREAM_MAX_S': '20'},
            ('AIJOB_STREAM_HEARTBEAT_MS', 'AIJOB_STREAM_MAX_S'),
        ),
    ],
)
def test_settings_that_contradict_each_other_are_refused_with_one_line_naming_both(env, names):
    with pytest.raises(ConfigError) as raised:
        load_config(env)
    message = str(raised.value)
    assert '\n' not in message
    assert all(name in message for name in names)


@pytest.mark.parametrize(
    'env',
    [
        {'AIJOB_HEARTBEAT_MS': '59999'},  # just below the lock TTL and the reap delay
        {'AIJOB_BATCH_POLL_FIRST_MS': '300000'},  # the first wait may be the longest
        {'AIJOB_STREAM_HEARTBEAT_MS': '1999', 'AIJOB_STREAM_MAX_S': '2'},
    ],
)
def test_settings_at_the_edge_of_agreeing_start(env):
    config = load_config(env)
    for name, raw in env.items():
        assert getattr(config, name[len('AIJOB_') :].lower()) == int(raw)


def test_cli_prints_one_line_for_settings_that_contradict_each_other():
    result = run_cli('initdb', AIJOB_HEARTBEAT_MS='60000', AIJOB_LOCK_TTL_MS='60000')
    assert result.returncode == 2
    assert result.stderr.strip().count('\n') == 0
    assert 'AIJOB_HEARTBEAT_MS=60000 must be below AIJOB_LOCK_TTL_MS=60000' in result.stderr


@pytest.mark.parametrize(
    'url',
    [
        'mysql://root@127.0.0.1:3306/x?features=postgres',
        'mysql://root@127.0.0.1:3306/x?features=mysql&features=mysql',
        'mysql://root@127.0.0.1:3306/x?charset=latin1',
    ],
)
def test_a_database_url_asks_only_for_a_feature_set_the_store_knows(url):
    with pytest.raises(ConfigError) as raised:
        load_config({'AIJOB_DATABASE_URL': url})
    assert 'AIJOB_DATABASE_URL' in str(raised.value)


def test_a_mariadb_url_may_force_mysqls_feature_set():
    url = 'mysql://root@127.0.0.1:3306/x?features=mysql'
    assert database_features(load_config({'AIJOB_DATABASE_URL': url}).database_url) == 'mysql'
    assert database_features('mysql://root@127.0.0.1:3306/x') is None
