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
from engine.gateway.cooldowns import (
    ANSWERED,
    FAILED,
    NO_CALL,
    CooldownPolicy,
    MemoryCooldowns,
    RedisCooldowns,
)
from engine.gateway.providers_config import Entry, ModelSpec
from engine.gateway.routes import RouteState
from engine.http import dashboard_pages
from engine.http.app import create_app
from engine.http.auth import TokenStore
from engine.http.metrics_view import scrape
from tests.support.backends import REDIS_URL, RUN_PREFIX, delete_redis_keys, require_servers
from tests.support.dashboard import FormClient
from tests.support.fake_openai import FakeOpenAI, Reply, error_reply, json_reply
from tests.support.helpers import create_job, wait_until
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
    assert cooldowns.acquire(entry, 'c8', 1000) == (True, 0.0)
    assert cooldowns.acquire(entry, 'c8b', 1000) == (True, 0.0)
    assert cooldowns.acquire(entry, 'c9', ttl) == (True, 0.0)
    cooldowns.report(entry, 'c9', FAILED)
    # c8 and c8b never report (their worker died): they count until their deadline only
    assert cooldowns.acquire(entry, 'c10', ttl) == (False, 1.0)
    advance(1.1)
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
