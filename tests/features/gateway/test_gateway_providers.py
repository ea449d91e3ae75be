"""AIJOB_PROVIDERS (issue 21 item 1): a good file (inline or @path), every bad entry refused with
one line naming it, the old one-provider settings as a shorthand, the prices of each
provider/model, what each call carries (max_tokens, the prompt estimate, price, limits), and
``python aijob.py providers [--check]`` with its keys masked."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from decimal import Decimal

import pytest

from engine.core.errors import ConfigError
from engine.execution.providers import Usage
from engine.extensions import load_config
from engine.features.gateway import providers_cli, providers_config
from engine.features.gateway.providers_config import Entry, Limits
from engine.runtime import Runtime
from tests.support.fake_openai import FakeOpenAI, json_reply
from tests.support.helpers import create_job
from tests.support.paths import ROOT
from tests.support.routed_jobs import routed_definition
from tests.support.runtimes import fast_registry, wait_terminal

DEEPSEEK_KEY = 'sk-deepseek-test-4f1a9c2e77'
OPENROUTER_KEY = 'sk-or-test-8b3d0e5a1c'


def example(deepseek_url='https://api.deepseek.com', openrouter_url='https://openrouter.ai/api/v1'):
    return {
        'providers': {
            'deepseek': {
                'baseUrl': deepseek_url,
                'apiKeyEnv': 'TEST_DEEPSEEK_KEY',
                'readTimeoutMs': 30000,
                'models': {
                    'deepseek-chat': {
                        'price': {
                            'prompt': '0.27',
                            'completion': '1.10',
                            'cachedPrompt': '0.07',
                            'batch': '0.5',
                        },
                        'limits': {'rpm': 600, 'tpm': 1000000},
                        'context': 65536,
                        'maxTokens': 4096,
                    }
                },
            },
            'openrouter': {
                'baseUrl': openrouter_url,
                'apiKeyEnv': 'TEST_OPENROUTER_KEY',
                'models': {
                    'deepseek/deepseek-chat': {
                        'price': {'prompt': '0.30', 'completion': '1.20', 'per': 1000000},
                        'context': 131072,
                    }
                },
            },
            'local': {'baseUrl': 'http://127.0.0.1:8080/v1', 'models': {'qwen2.5-7b': {}}},
        },
        'routes': {
            'default': ['deepseek/deepseek-chat', 'openrouter/deepseek/deepseek-chat'],
            'cheap': ['local/qwen2.5-7b', 'deepseek/deepseek-chat'],
        },
    }


KEYS = {'TEST_DEEPSEEK_KEY': DEEPSEEK_KEY, 'TEST_OPENROUTER_KEY': OPENROUTER_KEY}


def load(raw, **env):
    return providers_config.load(load_config(dict(env, AIJOB_PROVIDERS=raw)))


def test_a_good_file_gives_providers_models_prices_limits_and_routes():
    table = load(json.dumps(example()), **KEYS)
    assert list(table.providers) == ['deepseek', 'openrouter', 'local']
    chat = table.model(Entry('deepseek', 'deepseek-chat'))
    assert (chat.context, chat.max_tokens, chat.limits) == (65536, 4096, Limits(600, 1000000))
    assert (chat.price.prompt, chat.price.cached_prompt, chat.price.batch) == (
        Decimal('0.27'),
        Decimal('0.07'),
        Decimal('0.5'),
    )
    assert table.routes['default'] == (
        Entry('deepseek', 'deepseek-chat'),
        Entry('openrouter', 'deepseek/deepseek-chat'),  # split at the first slash
    )
    assert table.default_route == 'default'
    assert table.key_of('deepseek') == DEEPSEEK_KEY and table.key_of('local') is None
    assert not table.needs_key('local') and table.needs_key('openrouter')
    assert table.providers['openrouter'].read_timeout_ms == 60000  # the global default


def test_the_file_can_be_named_with_an_at_path_and_without_routes_every_model_is_one(tmp_path):
    raw = example()
    del raw['routes']
    path = tmp_path / 'providers.json'
    path.write_text(json.dumps(raw))
    table = load('@%s' % path, **KEYS)
    assert table.default_route == 'default'
    assert [e.key for e in table.routes['default']] == [
        'deepseek/deepseek-chat',
        'openrouter/deepseek/deepseek-chat',
        'local/qwen2.5-7b',
    ]
    with pytest.raises(ConfigError) as missing:
        load('@%s' % (tmp_path / 'nope.json'))
    assert 'AIJOB_PROVIDERS' in str(missing.value) and 'cannot read' in str(missing.value)


def test_without_a_default_route_the_first_one_is_the_default():
    raw = example()
    raw['routes'] = {'cheap': raw['routes']['cheap'], 'fast': raw['routes']['default']}
    assert load(json.dumps(raw)).default_route == 'cheap'


def broken(change):
    raw = example()
    change(raw)
    return json.dumps(raw)


def set_in(path, value):
    def change(raw):
        node = raw
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


# A provider without baseUrl is a plugin's own: only its models' price and limits.
PLUGIN = {'models': {'synthetic-1': {'price': {'prompt': '1', 'completion': '2'}}}}
PLUGIN_WITH_KEY = dict(PLUGIN, apiKeyEnv='TEST_DEEPSEEK_KEY')
SIZED = {'models': {'synthetic-1': {'context': 4096}}}


def route_to_a_plugin(raw):
    raw['providers']['synthetic'] = PLUGIN
    raw['routes']['fast'] = ['synthetic/synthetic-1']


BAD_ENTRIES = [
    ('providers', set_in(['providers'], {})),
    ('providers.Deep Seek', set_in(['providers', 'Deep Seek'], {'baseUrl': 'http://x'})),
    ('providers.deepseek.baseUrl', set_in(['providers', 'deepseek', 'baseUrl'], 'ftp://x')),
    ('providers.deepseek', set_in(['providers', 'deepseek', 'apiKey'], 'sk-in-the-file')),
    ('providers.deepseek.apiKeyEnv', set_in(['providers', 'deepseek', 'apiKeyEnv'], 'not a var')),
    ('providers.deepseek.readTimeoutMs', set_in(['providers', 'deepseek', 'readTimeoutMs'], 0)),
    ('providers.deepseek.models', set_in(['providers', 'deepseek', 'models'], {})),
    ('providers.deepseek.colour', set_in(['providers', 'deepseek', 'colour'], 'blue')),
    (
        'providers.deepseek.models.deepseek-chat.price',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'price'], {'prompt': 'x'}),
    ),
    (
        'providers.deepseek.models.deepseek-chat.price',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'price'], {'prompt': '-1'}),
    ),
    (
        'providers.deepseek.models.deepseek-chat.limits.rpm',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'limits'], {'rpm': 0}),
    ),
    (
        'providers.deepseek.models.deepseek-chat.limits.rps',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'limits'], {'rps': 1}),
    ),
    (
        'providers.deepseek.models.deepseek-chat.limits.tpm',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'limits'], {'tpm': True}),
    ),
    (
        'providers.deepseek.models.deepseek-chat.context',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'context'], '64k'),
    ),
    (
        'providers.deepseek.models.deepseek-chat.maxTokens',
        set_in(['providers', 'deepseek', 'models', 'deepseek-chat', 'maxTokens'], 70000),
    ),
    ('providers.synthetic.apiKeyEnv', set_in(['providers', 'synthetic'], PLUGIN_WITH_KEY)),
    ('providers.synthetic.models.synthetic-1.context', set_in(['providers', 'synthetic'], SIZED)),
    ('routes.fast[0]', route_to_a_plugin),
    ('routes.fast', set_in(['routes', 'fast'], [])),
    ('routes.fast[0]', set_in(['routes', 'fast'], ['deepseek-chat'])),
    ('routes.fast[1]', set_in(['routes', 'fast'], ['deepseek/deepseek-chat', 'nobody/x'])),
    ('routes.fast[0]', set_in(['routes', 'fast'], ['deepseek/gpt-9'])),
    ('routes.fast[1]', set_in(['routes', 'fast'], ['local/qwen2.5-7b', 'local/qwen2.5-7b'])),
]


@pytest.mark.parametrize('where,change', BAD_ENTRIES)
def test_each_bad_entry_is_refused_with_one_line_naming_it(where, change):
    with pytest.raises(ConfigError) as refused:
        load(broken(change))
    message = str(refused.value)
    assert message.startswith('AIJOB_PROVIDERS is invalid: %s: ' % where), message
    assert '\n' not in message
    assert 'sk-in-the-file' not in message


def test_not_json_and_not_an_object_are_refused_by_the_setting():
    for raw in ('{nope', '[1, 2]'):
        with pytest.raises(ConfigError) as refused:
            load_config({'AIJOB_PROVIDERS': raw})
        assert 'AIJOB_PROVIDERS' in str(refused.value)


def test_the_old_settings_are_a_one_provider_shorthand():
    config = load_config(
        {
            'AIJOB_PROVIDER_BASE_URL': 'http://127.0.0.1:9/v1',
            'AIJOB_PROVIDER_MODEL': 'fake-model',
            'AIJOB_PLATFORM_API_KEY': 'sk-platform-1234567',
        }
    )
    table = providers_config.load(config)
    assert table.source == 'AIJOB_PROVIDER_BASE_URL'
    assert [e.key for e in table.routes[table.default_route]] == ['openai/fake-model']
    assert table.key_of('openai') == 'sk-platform-1234567'
    assert providers_config.load(load_config({})) is None
    # The shorthand says nothing the file it stands for would not: the same config, no price.
    written = {
        'providers': {
            'openai': {
                'baseUrl': 'http://127.0.0.1:9/v1',
                'apiKeyEnv': 'AIJOB_PLATFORM_API_KEY',
                'models': {'fake-model': {}},
            }
        }
    }
    same = load(json.dumps(written), AIJOB_PLATFORM_API_KEY='sk-platform-1234567')
    assert replace(table, source=same.source) == same
    assert table.prices() == {} and table.limits() == {}


def test_the_shorthand_beside_the_file_stops_start_up():
    """The file replaces the shorthand: both set, the shorthand would be believed to add a
    provider the file does not have."""
    with pytest.raises(ConfigError) as refused:
        load(json.dumps(example()), AIJOB_PROVIDER_BASE_URL='http://127.0.0.1:9/v1', **KEYS)
    message = str(refused.value)
    assert message.startswith('AIJOB_PROVIDER_BASE_URL is set with AIJOB_PROVIDERS')
    assert '\n' not in message


def test_a_provider_without_base_url_prices_and_limits_a_plugins_own(make_runtime):
    """The synthetic provider's calls are priced and limited by the file, never routed."""
    priced = {'price': {'prompt': '1', 'completion': '2', 'per': 1000}, 'limits': {'rpm': 5}}
    raw = {'providers': {'synthetic': {'models': {'synthetic-1': priced}}}}
    table = load(json.dumps(raw))
    assert (table.routes, table.default_route, table.entries()) == ({}, None, [])
    shown = providers_cli.describe(load_config({'AIJOB_PROVIDERS': json.dumps(raw)}))
    assert "synthetic  a plugin's own provider" in shown[1]
    assert shown[-1] == 'routes: none (no provider has a baseUrl)'
    rt = make_runtime(registry=fast_registry(), AIJOB_PROVIDERS=json.dumps(raw))
    definition = rt.registry.get('synthetic')
    provider, model = rt.ai.gateway.route(definition, job=None)
    assert (provider.key, model) == ('synthetic', 'synthetic-1')
    assert rt.ai.pricing.cost('synthetic', 'synthetic-1', Usage(1000, 500)) == Decimal('2')
    [(entry, limits)] = rt.features['rate_limits'].limits.items()
    assert (entry, limits.rpm, limits.tpm) == ('synthetic/synthetic-1', 5, None)


def test_a_provider_without_base_url_that_no_plugin_has_stops_start_up(backend):
    raw = {'providers': {'synthetik': PLUGIN}}
    with pytest.raises(ConfigError) as refused:
        Runtime(backend.config(AIJOB_PROVIDERS=json.dumps(raw)), registry=fast_registry())
    message = str(refused.value)
    assert message.startswith('AIJOB_PROVIDERS is invalid: providers.synthetik has no baseUrl')


def test_a_definition_naming_an_unknown_route_stops_start_up(backend):
    registry = fast_registry(routed_definition(job_type='routed_fast', route='fast'))
    with pytest.raises(ConfigError) as refused:
        Runtime(backend.config(AIJOB_PROVIDERS=json.dumps(example())), registry=registry)
    assert "routed_fast names route 'fast'" in str(refused.value)
    with pytest.raises(ConfigError) as unset:
        Runtime(backend.config(), registry=registry)
    assert 'AIJOB_PROVIDERS is not set' in str(unset.value)


def test_prices_are_per_provider_and_model_with_cached_prompts_and_batch(make_runtime):
    rt = make_runtime(AIJOB_PROVIDERS=json.dumps(example()), **KEYS)
    pricing = rt.ai.pricing
    usage = Usage(prompt_tokens=1000, completion_tokens=100, cached_prompt_tokens=400)
    # 600 × 0.27 + 400 × 0.07 + 100 × 1.10 per million
    assert pricing.cost('deepseek', 'deepseek-chat', usage) == Decimal('0.000300')
    usage.batch = True
    assert pricing.cost('deepseek', 'deepseek-chat', usage) == Decimal('0.000150')
    # the same model name costs what its provider charges; an unpriced one costs 0
    plain = Usage(prompt_tokens=1000, completion_tokens=100)
    assert pricing.cost('openrouter', 'deepseek/deepseek-chat', plain) == Decimal('0.000420')
    assert pricing.cost('local', 'qwen2.5-7b', plain) == Decimal('0')


def test_each_call_carries_its_entry_and_max_tokens_goes_with_the_request(make_runtime):
    fake = FakeOpenAI(models=['deepseek-chat']).start()
    try:
        fake.script(json_reply({'done': True}))
        rt = make_runtime(
            registry=fast_registry(routed_definition()),
            AIJOB_PROVIDERS=json.dumps(example(deepseek_url=fake.base_url)),
            **KEYS,
        )
        seen = []

        class Spy:
            def before(self, call):
                seen.append(call)

            def after(self, call, usage, failure):
                pass

            def settle(self, call, usage, cost, error_code):
                pass

        rt.ai.guards.append(Spy())
        with rt.store.connection():
            rt.start_background()
            job = create_job(rt, job_type='routed', input={'text': 'x' * 400})
            assert wait_terminal(rt, job.id).lifecycle_status == 'succeeded'
        call = seen[0]
        assert (call.entry_key, call.max_tokens, call.has_next_entry) == (
            'deepseek/deepseek-chat',
            4096,
            True,
        )
        assert call.limits == Limits(600, 1000000) and call.price.prompt == Decimal('0.27')
        assert call.prompt_tokens > 100  # the rendered messages, 4 characters a token
        request = fake.requests[0]
        assert request['max_tokens'] == 4096 and request['model'] == 'deepseek-chat'
        assert request['_headers']['authorization'] == 'Bearer ' + DEEPSEEK_KEY
    finally:
        fake.stop()


def run_cli(*args, **env):
    return subprocess.run(
        [sys.executable, 'aijob.py', *args],
        cwd=ROOT,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_the_providers_command_prints_routes_limits_and_prices_with_keys_masked(tmp_path):
    path = tmp_path / 'providers.json'
    path.write_text(json.dumps(example()))
    result = run_cli('providers', AIJOB_PROVIDERS='@%s' % path, TEST_DEEPSEEK_KEY=DEEPSEEK_KEY)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert DEEPSEEK_KEY not in out and OPENROUTER_KEY not in out
    assert 'TEST_DEEPSEEK_KEY (set, sk-...%s)' % DEEPSEEK_KEY[-4:] in out
    assert 'TEST_OPENROUTER_KEY (NOT SET)' in out
    assert 'none (the provider takes no key)' in out
    assert 'rpm 600  tpm 1000000' in out
    assert 'prompt 0.27, completion 1.10, cached prompt 0.07, batch ×0.5' in out
    assert 'default: deepseek/deepseek-chat -> openrouter/deepseek/deepseek-chat' in out
    assert 'cheap: local/qwen2.5-7b -> deepseek/deepseek-chat' in out


@pytest.mark.slow
def test_providers_check_asks_each_model_list_with_its_key():
    good = FakeOpenAI(models=['deepseek-chat', 'deepseek-reasoner']).start()
    refusing = FakeOpenAI().start()
    refusing.models_status = 401
    try:
        raw = example(deepseek_url=good.base_url, openrouter_url=refusing.base_url)
        raw['providers']['local']['baseUrl'] = 'http://127.0.0.1:9/v1'  # nobody listens
        result = run_cli(
            'providers',
            '--check',
            AIJOB_PROVIDERS=json.dumps(raw),
            TEST_DEEPSEEK_KEY=DEEPSEEK_KEY,
            TEST_OPENROUTER_KEY=OPENROUTER_KEY,
        )
        assert result.returncode == 1
        out = result.stdout
        assert 'deepseek: ok (2 models listed)' in out
        assert 'openrouter: failed: CREDENTIAL_INVALID' in out
        assert 'local: failed: PROVIDER_UNAVAILABLE' in out
        assert good.model_requests[0]['authorization'] == 'Bearer ' + DEEPSEEK_KEY
        assert refusing.model_requests[0]['authorization'] == 'Bearer ' + OPENROUTER_KEY
        assert DEEPSEEK_KEY not in out + result.stderr
        good_only = example(deepseek_url=good.base_url)
        del good_only['providers']['openrouter'], good_only['providers']['local']
        good_only['routes'] = {'default': ['deepseek/deepseek-chat']}
        ok = run_cli(
            'providers', '--check', AIJOB_PROVIDERS=json.dumps(good_only), TEST_DEEPSEEK_KEY='k'
        )
        assert ok.returncode == 0 and 'deepseek: ok' in ok.stdout
    finally:
        good.stop()
        refusing.stop()
