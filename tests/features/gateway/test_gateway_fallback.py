"""Fallback along a route and cooldowns (issue 21 items 2 and 3), against two fake
OpenAI-compatible servers on two ports, on both backend pairs: the first down → jobs succeed on
the second, usage rows and history say so, the first is skipped while it cools down and used
again after; what does not fall back (a refused key, a user's own key); context length and
malformed output; the cooldown rule itself, in the process and in Redis."""

import contextlib
import dataclasses
import functools
import json
import time
from types import SimpleNamespace

import pytest
import redis

from engine.core.models import AiJob, AiJobEvent, AiUsageLog
from engine.core.registry import CredentialPolicy
from engine.core.status_view import find_for_status, job_status
from engine.features.dashboard import pages as dashboard_pages
from engine.features.gateway.context_errors import CONTEXT_LENGTH_SIGNS, context_length_sign
from engine.features.gateway.cooldowns import (
    ANSWERED,
    FAILED,
    NO_CALL,
    CooldownPolicy,
    MemoryCooldowns,
    RedisCooldowns,
)
from engine.features.gateway.providers_config import Entry, ModelSpec
from engine.features.gateway.routes import RouteState
from engine.features.metrics.scrape import scrape
from engine.http.app import create_app
from engine.http.auth import TokenStore
from tests.support.backends import REDIS_URL, RUN_PREFIX, delete_redis_keys, require_servers
from tests.support.dashboard import FormClient
from tests.support.fake_openai import FakeOpenAI, Reply, error_reply, json_reply
from tests.support.helpers import create_job, wait_until
from tests.support.provider_outage import recover_through_outage, recovery_settings
from tests.support.routed_jobs import routed_definition
from tests.support.runtimes import FAST_SETTINGS, MASTER_KEY, fast_registry, wait_terminal

KEY_A, KEY_B = 'sk-provider-a-51f0c9d2', 'sk-provider-b-7e3a8b41'
COOLDOWN_MS = 2000


def providers(a, b, a_models=None, b_models=None, route=None):
    return json.dumps(
        {
            'providers': {
                'a': {
                    'baseUrl': a.base_url,
                    'apiKeyEnv': 'TEST_KEY_A',
                    'models': a_models or {'model-a': {}},
                },
                'b': {
                    'baseUrl': b.base_url,
                    'apiKeyEnv': 'TEST_KEY_B',
                    'models': b_models or {'model-b': {}},
                },
            },
            'routes': {'default': route or ['a/model-a', 'b/model-b']},
        }
    )


@pytest.fixture
def fakes():
    a, b = FakeOpenAI().start(), FakeOpenAI().start()
    a.script(json_reply({'from': 'a'}))
    b.script(json_reply({'from': 'b'}))
    yield a, b
    for fake in (a, b):
        try:
            fake.stop()
        except OSError:
            pass


@pytest.fixture
def routed_rt(make_runtime, fakes):
    """``routed_rt(*definitions, **settings)``: a runtime on the two fakes' route, running its
    background loops, with a connection open until the test ends."""
    with contextlib.ExitStack() as stack:
        yield functools.partial(_routed_rt, make_runtime, fakes, stack)


def _routed_rt(make_runtime, fakes, stack, *definitions, **settings):
    a, b = fakes
    settings.setdefault('AIJOB_PROVIDERS', providers(a, b))
    rt = make_runtime(
        registry=fast_registry(routed_definition(), *definitions),
        TEST_KEY_A=KEY_A,
        TEST_KEY_B=KEY_B,
        AIJOB_COOLDOWN_FAILURES='3',
        AIJOB_COOLDOWN_WINDOW_MS='30000',
        AIJOB_COOLDOWN_MS=str(COOLDOWN_MS),
        AIJOB_CREDENTIAL_MASTER_KEY=MASTER_KEY,
        **dict(FAST_SETTINGS, **settings),
    )
    stack.enter_context(rt.store.connection())
    rt.start_background()
    return rt


def run(rt, job_type='routed', **kw):
    job = create_job(rt, job_type=job_type, **kw)
    return wait_terminal(rt, job.id)


def usage(job):
    rows = AiUsageLog.select().where(AiUsageLog.job_id == job.id).order_by(AiUsageLog.id)
    return [(r.provider, r.model, r.error_code) for r in rows]


def fallbacks(job):
    rows = AiJobEvent.select().where(
        (AiJobEvent.job_id == job.id) & (AiJobEvent.kind == 'fallback')
    )
    return [(r.detail['from'], r.detail['to'], r.detail['errorCode']) for r in rows]


@pytest.mark.slow
def test_the_first_provider_down_jobs_succeed_on_the_second_and_it_is_used_again_after(
    routed_rt, fakes
):
    a, b = fakes
    rt = routed_rt()
    a.stop()  # down: connections refused
    jobs = [run(rt) for _ in range(6)]
    assert [job.lifecycle_status for job in jobs] == ['succeeded'] * 6
    down = ('a', 'model-a', 'PROVIDER_UNAVAILABLE')
    # Three jobs discover the outage (each its own failed call, then the next entry) …
    for job in jobs[:3]:
        assert usage(job) == [down, ('b', 'model-b', None)]
        assert fallbacks(job) == [('a/model-a', 'b/model-b', 'PROVIDER_UNAVAILABLE')]
    # … then every worker skips it: no call, straight to the second entry.
    for job in jobs[3:]:
        assert usage(job) == [('b', 'model-b', None)]
        assert fallbacks(job) == [('a/model-a', 'b/model-b', 'PROVIDER_COOLDOWN')]
    assert len(b.requests) == 6
    # The status and the dashboard name the model that produced the result.
    status = job_status(*find_for_status(jobs[4].id))
    assert (status['result']['provider'], status['result']['model']) == ('b', 'model-b')
    assert dashboard_pages.job_detail(rt, jobs[4].id)['answered_by'] == 'b/model-b'
    # The cooldown shows in /metrics and on the dashboard's overview.
    assert 0 < rt.ai.gateway.cooldown_state()['a/model-a'] <= COOLDOWN_MS / 1000.0
    text = scrape(rt).decode()
    assert 'aijob_provider_cooldown_seconds{model="model-a",provider="a"} ' in text
    assert 'aijob_provider_cooldown_seconds{model="model-b",provider="b"} 0.0' in text
    assert [entry for entry, _ in dashboard_pages.overview(rt)['cooldowns']] == ['a/model-a']
    operator = FormClient(create_app(rt))
    assert operator.sign_in(TokenStore(rt.store).create('root', admin=True)).status == 303
    assert '<code>a/model-a</code>' in operator.get('/dashboard').text
    assert (
        '<dd id="answered-by">b/model-b</dd>' in operator.get('/dashboard/jobs/' + jobs[4].id).text
    )

    # Back after its cooldown: used again, first in its route.
    a.restart()
    wait_until(lambda: rt.ai.gateway.cooldown_state()['a/model-a'] == 0, timeout=10)
    again = run(rt)
    assert again.lifecycle_status == 'succeeded'
    assert usage(again) == [('a', 'model-a', None)] and fallbacks(again) == []
    assert len(a.requests) == 1 and len(b.requests) == 6
    assert job_status(*find_for_status(again.id))['result']['model'] == 'model-a'
    assert a.requests[0]['_headers']['authorization'] == 'Bearer ' + KEY_A
    assert b.requests[0]['_headers']['authorization'] == 'Bearer ' + KEY_B


def test_a_5xx_and_a_429_with_retry_after_move_on_and_the_429_cools_the_entry_down(
    routed_rt, fakes
):
    a, b = fakes
    a.script(
        error_reply(503, 'overloaded'), error_reply(429, 'slow down', headers={'Retry-After': '30'})
    )
    rt = routed_rt()
    first = run(rt)
    assert usage(first) == [('a', 'model-a', 'PROVIDER_UNAVAILABLE'), ('b', 'model-b', None)]
    second = run(rt)
    assert usage(second) == [('a', 'model-a', 'PROVIDER_RATE_LIMITED'), ('b', 'model-b', None)]
    assert rt.ai.gateway.cooldown_state()['a/model-a'] > 25  # as long as Retry-After asked
    third = run(rt)
    assert usage(third) == [('b', 'model-b', None)] and len(a.requests) == 2


def test_a_refused_key_does_not_fall_back(routed_rt, fakes):
    a, b = fakes
    a.script(error_reply(401, 'bad key'))
    rt = routed_rt()
    job = run(rt)
    assert (job.lifecycle_status, job.error_code) == ('failed', 'CREDENTIAL_INVALID')
    assert usage(job) == [('a', 'model-a', 'CREDENTIAL_INVALID')]
    assert fallbacks(job) == [] and b.requests == []


def test_a_job_on_a_users_own_key_falls_back_only_within_that_users_provider(routed_rt, fakes):
    a, b = fakes
    a_models = {'model-a': {}, 'model-a2': {}}
    route = ['a/model-a', 'b/model-b', 'a/model-a2']
    keyed = dataclasses.replace(
        routed_definition(job_type='routed_keyed'),
        credential=CredentialPolicy(('platform_key', 'user_deepseek_key'), 'platform_key'),
    )
    rt = routed_rt(keyed, AIJOB_PROVIDERS=providers(a, b, a_models=a_models, route=route))
    a.script(error_reply(500, 'broken'), json_reply({'from': 'a2'}))
    user_key = 'sk-users-own-key-93be41'
    credential = rt.ai.credential_store.register('user-a', 'a', user_key)
    overrides = {'credentialMode': 'user_deepseek_key', 'credentialId': credential.id}
    job = run(rt, job_type='routed_keyed', overrides=overrides)
    assert job.lifecycle_status == 'succeeded'
    assert usage(job) == [('a', 'model-a', 'PROVIDER_ERROR'), ('a', 'model-a2', None)]
    assert fallbacks(job) == [('a/model-a', 'a/model-a2', 'PROVIDER_ERROR')]
    assert b.requests == []  # another provider never sees the user's key
    assert [r['_headers']['authorization'] for r in a.requests] == ['Bearer ' + user_key] * 2


def test_context_length_moves_to_the_next_entry_with_a_larger_context(routed_rt, fakes):
    a, b = fakes
    a_models = {'small': {'context': 8000}, 'tiny': {'context': 4000}}
    b_models = {'big': {'context': 128000}}
    route = ['a/small', 'a/tiny', 'b/big']
    rt = routed_rt(
        AIJOB_PROVIDERS=providers(a, b, a_models=a_models, b_models=b_models, route=route)
    )
    a.script(
        error_reply(
            400, "This model's maximum context length is 8000 tokens", 'context_length_exceeded'
        )
    )
    job = run(rt)
    assert job.lifecycle_status == 'succeeded'
    code = 'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH'
    assert usage(job) == [('a', 'small', code), ('b', 'big', None)]
    assert fallbacks(job) == [('a/small', 'b/big', code)]
    assert len(a.requests) == 1


# The error bodies servers answer when a request does not fit, each with the sign of
# CONTEXT_LENGTH_SIGNS it is recognised by.
CONTEXT_LENGTH_BODIES = {
    'openai': (
        {
            'error': {
                'message': "This model's maximum context length is 8192 tokens. However, your "
                'messages resulted in 9000 tokens. Please reduce the length of the messages.',
                'type': 'invalid_request_error',
                'param': 'messages',
                'code': 'context_length_exceeded',
            }
        },
        ('OpenAI', 'code'),
    ),
    'llama.cpp': (
        {
            'error': {
                'code': 400,
                'message': 'request (9000 tokens) exceeds the available context size '
                '(8192 tokens), try increasing it',
                'type': 'exceed_context_size_error',
                'n_prompt_tokens': 9000,
                'n_ctx': 8192,
            }
        },
        ('llama.cpp', 'type'),
    ),
    'llama.cpp, older': (
        {
            'error': {
                'code': 400,
                'message': 'the request exceeds the available context size, try increasing it',
                'type': 'invalid_request_error',
            }
        },
        ('llama.cpp', 'message'),
    ),
    'litellm': (
        {
            'error': {
                'message': 'litellm.BadRequestError: litellm.ContextWindowExceededError: '
                'AnthropicError - prompt is too long: 209303 tokens > 200000 maximum\n'
                'Received Model Group=small\nAvailable Model Group Fallbacks=None',
                'type': None,
                'param': None,
                'code': '400',
            }
        },
        ('LiteLLM', 'message'),
    ),
    'vllm, decoder prompt': (
        {
            'error': {
                'object': 'error',
                'message': 'The decoder prompt (length 9000) is longer than the maximum model '
                'length of 8192. Make sure that `max_model_len` is no smaller than the number '
                'of text tokens.',
                'type': 'BadRequestError',
                'param': None,
                'code': 400,
            }
        },
        ('vLLM', 'message'),
    ),
    'vllm': (
        {  # older vLLM servers send the error object itself, with no "error" around it
            'object': 'error',
            'message': "This model's maximum context length is 8192 tokens. However, you "
            'requested 9000 tokens (8000 in the messages, 1000 in the completion). Please '
            'reduce the length of the messages or completion.',
            'type': 'BadRequestError',
            'param': None,
            'code': 400,
        },
        ('OpenAI, DeepSeek, vLLM', 'message'),
    ),
    'deepseek': (
        {
            'error': {
                'message': "This model's maximum context length is 65536 tokens. However, you "
                'requested 66343 tokens (62247 in the messages, 4096 in the completion). Please '
                'reduce the length of the messages or completion.',
                'type': 'invalid_request_error',
                'param': None,
                'code': 'invalid_request_error',
            }
        },
        ('OpenAI, DeepSeek, vLLM', 'message'),
    ),
}


def test_every_context_length_sign_is_the_one_a_real_error_body_is_recognised_by():
    found = {}
    for name, (body, expected) in CONTEXT_LENGTH_BODIES.items():
        error = body.get('error', body)
        sign = context_length_sign(error.get('code'), error.get('type'), error['message'])
        assert (sign.provider, sign.field) == expected, name
        found[name] = sign
    assert set(found.values()) == set(CONTEXT_LENGTH_SIGNS)
    # Another bad request is none of them.
    assert context_length_sign('invalid_request_error', None, 'unknown parameter: foo') is None
    assert context_length_sign(400, 'BadRequestError', 'max_tokens must be at least 1') is None


@pytest.mark.parametrize('server', sorted(CONTEXT_LENGTH_BODIES))
def test_each_servers_context_length_error_moves_to_the_entry_with_a_larger_context(
    routed_rt, fakes, server
):
    a, b = fakes
    a_models = {'small': {'context': 8000}}
    b_models = {'big': {'context': 128000}}
    route = ['a/small', 'b/big']
    rt = routed_rt(
        AIJOB_PROVIDERS=providers(a, b, a_models=a_models, b_models=b_models, route=route)
    )
    a.script(Reply(status=400, error_body=CONTEXT_LENGTH_BODIES[server][0]))
    job = run(rt)
    assert job.lifecycle_status == 'succeeded'
    code = 'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH'
    assert usage(job) == [('a', 'small', code), ('b', 'big', None)]
    assert fallbacks(job) == [('a/small', 'b/big', code)]
    assert len(a.requests) == 1


def test_context_length_without_a_larger_model_fails_at_once(routed_rt, fakes):
    a, b = fakes
    a.script(error_reply(400, 'maximum context length exceeded', 'context_length_exceeded'))
    rt = routed_rt()  # no model says how large its context is
    job = run(rt)
    assert (job.lifecycle_status, job.error_code) == (
        'failed',
        'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH',
    )
    assert len(a.requests) == 1 and b.requests == []


def test_malformed_output_is_retried_once_on_its_entry_then_moves_on(routed_rt, fakes):
    a, b = fakes
    a.script(Reply(content='not json at all'))
    rt = routed_rt()
    job = run(rt)
    assert job.lifecycle_status == 'succeeded'
    bad = ('a', 'model-a', 'VALIDATION_JSON')
    assert usage(job) == [bad, bad, ('b', 'model-b', None)]
    assert fallbacks(job) == [('a/model-a', 'b/model-b', 'VALIDATION_JSON')]
    # Malformed output says nothing of the provider's health: no cooldown.
    assert rt.ai.gateway.cooldown_state()['a/model-a'] == 0


def test_retries_used_up_on_the_last_entry_fail_the_job_without_another_fallback(routed_rt, fakes):
    a, b = fakes
    a.script(error_reply(502))
    b.script(error_reply(502))
    rt = routed_rt()
    job = run(rt)
    assert (job.lifecycle_status, job.error_code) == ('failed', 'PROVIDER_UNAVAILABLE')
    assert [u[:2] for u in usage(job)] == [('a', 'model-a'), ('b', 'model-b'), ('b', 'model-b')]
    assert fallbacks(job) == [('a/model-a', 'b/model-b', 'PROVIDER_UNAVAILABLE')]
    assert AiJob.get_by_id(job.id).retry_count == 2


def test_a_move_is_decided_once_per_call_and_given_again_to_a_retried_write():
    entries = (Entry('a', 'm1'), Entry('a', 'm2'), Entry('b', 'm3'))
    state = RouteState(entries)
    job = SimpleNamespace(id='j', attempt_no=1, max_retry_count=2)
    definition = routed_definition()

    def call(no, entry):
        return SimpleNamespace(
            call_no=no,
            provider_key=entry.provider,
            model=entry.model,
            job=job,
            definition=definition,
        )

    models = {e: ModelSpec(e.model) for e in entries}.get
    first = call(1, entries[0])
    moved = state.move_after(first, 'PROVIDER_TIMEOUT', models)
    assert moved == (entries[0], entries[1]) and state.index == 1
    # the transaction that wrote it rolled back and runs again: the same move, not a second
    assert state.move_after(first, 'PROVIDER_TIMEOUT', models) == moved and state.index == 1
    # the last allowed call moves nothing: no call follows it
    assert state.move_after(call(3, entries[1]), 'PROVIDER_ERROR', models) is None
    assert state.index == 1


# ---------------------------------------------------------------- the cooldown rule
class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def check_rule(cooldowns, advance):
    """The same rule whatever holds the state: N failures start a cooldown; once an entry has
    failed, its failures plus the calls in flight stay below N; a success forgets the failures;
    a call that never reports stops counting at its deadline."""
    entry, ttl = 'p/m', 60000
    assert cooldowns.acquire(entry, 'c1', ttl) == (True, 0.0)  # healthy: every call goes
    assert cooldowns.acquire(entry, 'c2', ttl) == (True, 0.0)
    assert cooldowns.acquire(entry, 'c3', ttl) == (True, 0.0)
    assert cooldowns.report(entry, 'c1', FAILED) == 0.0
    # 1 failure + 2 calls in flight: a fourth call would make it 4 > 3, so it waits
    assert cooldowns.acquire(entry, 'c4', ttl) == (False, 1.0)
    assert cooldowns.report(entry, 'c2', NO_CALL) == 0.0  # frees its place, counts nothing
    assert cooldowns.acquire(entry, 'c4', ttl) == (True, 0.0)
    assert cooldowns.report(entry, 'c3', FAILED) == 0.0  # 2 failures
    left = cooldowns.report(entry, 'c4', FAILED)  # 3: cooling down
    assert 0 < left <= 5.0
    assert cooldowns.acquire(entry, 'c5', ttl)[0] is False
    assert 0 < cooldowns.remaining([entry, 'p/other'])[entry] <= 5.0
    assert cooldowns.remaining([entry, 'p/other'])['p/other'] == 0
    advance(5.2)
    assert cooldowns.acquire(entry, 'c6', ttl) == (True, 0.0)
    # a success in between: the failures before it no longer count
    cooldowns.report(entry, 'c6', FAILED)
    assert cooldowns.acquire(entry, 'c7', ttl) == (True, 0.0)
    cooldowns.report(entry, 'c7', ANSWERED)
    # Deadlines of 3 s: the four calls below take milliseconds, however slowly the Redis kind's
    # real clock runs under load.
    assert cooldowns.acquire(entry, 'c8', 3000) == (True, 0.0)
    assert cooldowns.acquire(entry, 'c8b', 3000) == (True, 0.0)
    assert cooldowns.acquire(entry, 'c9', ttl) == (True, 0.0)
    cooldowns.report(entry, 'c9', FAILED)
    # c8 and c8b never report (their worker died): they count until their deadline only
    assert cooldowns.acquire(entry, 'c10', ttl) == (False, 1.0)
    advance(3.1)
    assert cooldowns.acquire(entry, 'c10', ttl) == (True, 0.0)
    # a 429 with Retry-After cools the entry down at once, as long as it asks
    assert cooldowns.acquire('p/limited', 'r1', ttl) == (True, 0.0)
    assert cooldowns.report('p/limited', 'r1', FAILED, retry_after_s=30) == 30.0


def test_the_cooldown_rule_in_the_process():
    clock = Clock()
    cooldowns = MemoryCooldowns(CooldownPolicy(3, 60000, 5000), clock=clock)

    def advance(seconds):
        clock.now += seconds

    check_rule(cooldowns, advance)


@pytest.mark.slow
def test_the_cooldown_rule_in_redis():
    require_servers('redis')
    prefix = '%s-cooldowns' % RUN_PREFIX
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        cooldowns = RedisCooldowns(CooldownPolicy(3, 60000, 5000), client, prefix)
        assert cooldowns.key('p/m') == '%s:{gateway}:cooldown:p/m' % prefix
        check_rule(cooldowns, time.sleep)
        assert 0 < client.pttl(cooldowns.key('p/m')) <= 60000 + 5000 + 60000
        assert 0 < client.pttl(cooldowns.flying_key('p/m')) <= 60000
    finally:
        client.close()
        delete_redis_keys(prefix)


def check_probe(worker_a, worker_b, advance, now):
    """While an entry cools, one call per probe interval goes, from whichever worker asks first;
    its answer ends the cooldown for every worker, its failure keeps it and starts the interval
    again; a probe whose worker died frees the claim at its deadline; no probe goes before a
    Retry-After has passed. ``worker_a`` and ``worker_b`` share the state (two processes).
    ``now()`` reads the workers' clock (in seconds): the time a worker gives shrinks by what
    passed since it was set, so each lower bound allows for that, measured (none on the
    process kind's clock, which only ``advance`` moves)."""
    entry, ttl = 'p/one', 60000

    def since(moment):  # plus the millisecond a worker reads its clock to
        return now() - moment + 0.001

    started = now()
    for call_id in ('f1', 'f2', 'f3'):
        assert worker_a.acquire(entry, call_id, ttl) == (True, 0.0)
        left = worker_a.report(entry, call_id, FAILED)
    assert 60 - since(started) <= left <= 60  # cooling for the whole cooldown
    go, wait_s = worker_b.acquire(entry, 'early', ttl)
    # until the first probe's time, not the cooldown's end
    assert not go and 1.0 - since(started) <= wait_s <= 1.0
    advance(1.05)
    assert worker_b.acquire(entry, 'probe-1', ttl) == (True, 0.0)  # the probe: worker b's
    go, wait_s = worker_a.acquire(entry, 'other', ttl)
    assert not go and 0.1 <= wait_s <= 1.0  # one probe at a time: the others follow it closely
    failed = now()  # before the report: the interval starts while it runs, not after it returns
    left = worker_b.report(entry, 'probe-1', FAILED)
    assert 60 - since(started) <= left <= 60  # a failure keeps the cooldown
    go, wait_s = worker_a.acquire(entry, 'other', ttl)
    assert not go and 1.0 - since(failed) <= wait_s <= 1.0  # and starts the interval again
    advance(1.05)
    # Its worker dies. A deadline of 3 s: the next call comes milliseconds later, however
    # slowly the Redis kind's real clock runs under load.
    assert worker_a.acquire(entry, 'probe-2', 3000) == (True, 0.0)
    assert worker_b.acquire(entry, 'other', ttl)[0] is False
    advance(3.1)  # past the dead probe's deadline: the claim is free
    assert worker_b.acquire(entry, 'probe-3', ttl) == (True, 0.0)
    assert worker_a.acquire(entry, 'other', ttl)[0] is False
    assert worker_b.report(entry, 'probe-3', ANSWERED) == 0.0  # back: over for every worker
    assert worker_a.remaining([entry])[entry] == 0
    assert worker_a.acquire(entry, 'after-a', ttl) == (True, 0.0)
    assert worker_b.acquire(entry, 'after-b', ttl) == (True, 0.0)
    # A 429's Retry-After is the provider's own word: no probe before it has passed.
    assert worker_a.acquire('p/asked', 'r1', ttl) == (True, 0.0)
    asked = now()
    assert worker_a.report('p/asked', 'r1', FAILED, retry_after_s=30) == 30.0
    advance(1.05)
    go, wait_s = worker_b.acquire('p/asked', 'r2', ttl)
    assert not go and 30 - since(asked) <= wait_s <= 29


PROBE_POLICY = CooldownPolicy(3, 60000, 60000, probe_ms=1000)


def test_one_probe_per_interval_ends_or_keeps_the_cooldown_in_the_process():
    clock = Clock()
    cooldowns = MemoryCooldowns(PROBE_POLICY, clock=clock)

    def advance(seconds):
        clock.now += seconds

    check_probe(cooldowns, cooldowns, advance, clock)


def test_one_probe_per_interval_ends_or_keeps_the_cooldown_in_redis():
    require_servers('redis')
    prefix = '%s-probes' % RUN_PREFIX
    clients = [redis.Redis.from_url(REDIS_URL, decode_responses=True) for _ in range(2)]
    try:
        worker_a, worker_b = (RedisCooldowns(PROBE_POLICY, c, prefix) for c in clients)
        check_probe(worker_a, worker_b, time.sleep, time.monotonic)
    finally:
        for client in clients:
            client.close()
        delete_redis_keys(prefix)


# ---------------------------------------------------------------- a one-provider route recovers
@pytest.mark.slow
def test_a_one_provider_route_is_used_again_within_a_probe_interval_of_its_recovery(
    make_runtime,
):
    fake = FakeOpenAI().start()
    try:
        patient = routed_definition(max_retries=10)  # each failed probe spends a retry
        rt = make_runtime(registry=fast_registry(patient), **recovery_settings(fake))
        with rt.store.connection():
            rt.start_background()
        recover_through_outage(rt, fake, 'in one process')
    finally:
        fake.stop()
