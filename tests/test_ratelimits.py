"""Rate limits (issue 21 item 4): the sliding-window log with booked slots, in Redis (one Lua script
shared by every process) and in the process, exact under concurrency; the guard around the
engine's calls, on both backend pairs."""

import threading
import time
import types
import uuid

import pytest
import redis

from engine.core.errors import ConfigError
from engine.core.models import AiJob, AiJobEvent
from engine.execution.providers import EntryUnavailable, ProviderCall, ProviderRequest, Usage
from engine.gateway.ratelimits import (
    Limits,
    LocalWindow,
    RateLimitGuard,
    RedisWindow,
    parse_limits,
)
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers
from tests.support.helpers import create_job
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal


@pytest.fixture(params=['local', 'redis'])
def make_window(request):
    """``make_window(counted_ms, late_ms)``: a fresh limiter of either kind; each call of the
    Redis kind is a client of its own (as another process would be), on the same keys."""
    if request.param == 'local':
        shared = {}

        def make(counted_ms, late_ms):
            if 'window' not in shared:
                shared['window'] = LocalWindow(counted_ms, late_ms)
            return shared['window']

        yield make
        return
    require_servers('redis')
    prefix = 'aijob-test-rl-%s' % uuid.uuid4().hex[:8]
    clients = []

    def make(counted_ms, late_ms):
        clients.append(redis.Redis.from_url(REDIS_URL, decode_responses=True))
        return RedisWindow(clients[-1], prefix, counted_ms, late_ms)

    yield make
    for client in clients:
        client.close()
    delete_redis_keys(prefix)


def slot_of(member):
    return int(float(member.rsplit('@', 1)[1]))


def test_no_window_ever_holds_more_than_the_limit_under_concurrent_reservations(make_window):
    limit, counted_ms = 25, 400
    windows = [make_window(counted_ms, 0) for _ in range(4)]
    admitted, lock = [], threading.Lock()
    stop_at = time.monotonic() + 1.3

    def hammer(i):
        window, n = windows[i % len(windows)], 0
        while time.monotonic() < stop_at:
            n += 1
            slot = window.reserve('p/m', 't%d-%d' % (i, n), 0, Limits(rpm=limit), book=False)
            if slot.wait_ms == 0:
                with lock:
                    admitted.append(slot_of(slot.member))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    admitted.sort()
    # Any limit + 1 requests span more than the counted window: no window holds limit + 1.
    assert all(
        admitted[i + limit] - admitted[i] >= counted_ms for i in range(len(admitted) - limit)
    )
    # And the limit is used: 1.3 s holds at least three full windows of 0.4 s.
    assert len(admitted) >= 3 * limit
    print('admitted %d in 1.3 s at %d per %d ms' % (len(admitted), limit, counted_ms))


def test_waiting_calls_get_their_own_slots_in_order_and_take_them_when_they_come_back(
    make_window,
):
    window = make_window(300, 100)
    two = Limits(rpm=2)
    started = time.monotonic()
    assert window.reserve('p/m', 'a', 0, two, book=True).wait_ms == 0
    assert window.reserve('p/m', 'b', 0, two, book=True).wait_ms == 0
    c = window.reserve('p/m', 'c', 0, two, book=True).wait_ms
    d = window.reserve('p/m', 'd', 0, two, book=True).wait_ms
    e = window.reserve('p/m', 'e', 0, two, book=True).wait_ms
    # c and d take the slots a and b leave; e the one c leaves: one wake-up per opening.
    # (Bounds loose by 100 ms: a loaded machine may take that long between the calls.)
    assert 150 <= c <= 300 and 150 <= d <= 300 and 200 <= e - c <= 300
    early = window.reserve('p/m', 'c', 0, two, book=True)
    assert 0 < early.wait_ms <= c  # too early: still its own slot, not a new one
    time.sleep(c / 1000.0)
    on_time = window.reserve('p/m', 'c', 0, two, book=True)
    assert on_time.wait_ms == 0 and on_time.member.startswith('c@')
    # A newcomer queues behind every booked slot (e's is the last: f shares it, 2 per window).
    elapsed_ms = (time.monotonic() - started) * 1000.0
    assert window.reserve('p/m', 'f', 0, two, book=True).wait_ms >= e - elapsed_ms - 5
    assert window.reserve('p/m', 'g', 0, two, book=True).wait_ms >= e - elapsed_ms + 250


def test_a_call_later_than_its_slot_allows_queues_again(make_window):
    window = make_window(300, 50)
    one = Limits(rpm=1)
    assert window.reserve('p/m', 'a', 0, one, book=True).wait_ms == 0
    wait_ms = window.reserve('p/m', 'b', 0, one, book=True).wait_ms
    booked_at = time.monotonic() + wait_ms / 1000.0
    time.sleep(wait_ms / 1000.0 + 0.12)  # past its slot by more than the 50 ms allowed
    late = window.reserve('p/m', 'b', 0, one, book=True)
    if late.wait_ms == 0:  # the window had room again by now: a new slot, not the old one
        assert slot_of(late.member) >= slot_of(late.member) - 1
        assert time.monotonic() - booked_at > 0.05
    else:
        assert late.wait_ms > 0


def test_a_booked_slot_is_not_given_to_a_call_that_may_try_another_entry(make_window):
    window = make_window(300, 50)
    one = Limits(rpm=1)
    assert window.reserve('p/m', 'a', 0, one, book=False).wait_ms == 0
    unbooked = window.reserve('p/m', 'b', 0, one, book=False).wait_ms
    booked = window.reserve('p/m', 'c', 0, one, book=True).wait_ms
    assert booked == pytest.approx(unbooked, abs=20)  # b took no slot: c has the first one
    assert window.reserve('p/m', 'd', 0, one, book=True).wait_ms >= booked + 250


def test_tokens_are_reserved_at_their_estimate_and_settled_with_the_usage(make_window):
    window = make_window(60_000, 0)
    limits = Limits(tpm=100)
    first = window.reserve('p/m', 'a', 60, limits, book=False)
    assert first.wait_ms == 0
    assert window.reserve('p/m', 'b', 60, limits, book=False).wait_ms > 0  # 120 > 100
    window.settle('p/m', first.member, 20)  # it used 20 of its 60
    second = window.reserve('p/m', 'b', 60, limits, book=False)
    assert second.wait_ms == 0  # 80 <= 100
    window.release('p/m', second.member)  # never sent
    assert window.reserve('p/m', 'c', 80, limits, book=False).wait_ms == 0  # 100 <= 100


def test_limits_are_parsed_with_the_entry_named_in_the_error():
    assert parse_limits({'openai/gpt': {'rpm': 60, 'tpm': 1000}}) == {
        'openai/gpt': Limits(60, 1000)
    }
    with pytest.raises(ConfigError, match='openai/gpt: rpm must be a positive integer'):
        parse_limits({'openai/gpt': {'rpm': 0}})
    with pytest.raises(ConfigError, match='not "provider/model"'):
        parse_limits({'gpt': {'rpm': 1}})
    with pytest.raises(ConfigError, match='openai/gpt: expected'):
        parse_limits({'openai/gpt': {'rps': 1}})


def provider_call(job_id, has_next_entry=False, limits=None, max_tokens=None, model='m'):
    request = ProviderRequest(job_id, 'synthetic', 1, {}, None, None, model=model)
    return ProviderCall(
        job=types.SimpleNamespace(id=job_id),
        definition=None,
        request=request,
        provider=types.SimpleNamespace(key='p'),
        model=model,
        call_no=1,
        limits=limits,
        max_tokens=max_tokens,
        prompt_tokens=10,
        has_next_entry=has_next_entry,
    )


def test_the_guard_moves_a_call_on_or_books_its_slot_and_settles_its_tokens():
    window = LocalWindow(1000, 100)
    guard = RateLimitGuard(window, {'p/m': Limits(rpm=1, tpm=1000)})
    first = provider_call('job-1', max_tokens=90)
    assert guard.before(first) is None
    with pytest.raises(EntryUnavailable) as moved:
        guard.before(provider_call('job-2', has_next_entry=True))
    assert moved.value.reason == 'rate_limit' and moved.value.detail['entry'] == 'p/m'
    with pytest.raises(EntryUnavailable) as waits:
        guard.before(provider_call('job-3'))
    assert waits.value.delay_s == pytest.approx(moved.value.delay_s, abs=0.05)
    assert [name for _, name in window._logs['p/m'].slots] == [
        'job-1:1@%d' % (window._logs['p/m'].slots[0][0]),
        'job-3:1',
    ]  # only job-3 (no other entry) booked a slot
    assert window._logs['p/m'].total == 100 + 10  # the estimates: 10 + 90, and 10
    guard.after(first, Usage(10, 5), None)
    assert window._logs['p/m'].total == 15 + 10
    # A call's own limits (the provider file's) count as the setting's do; no limit, no count.
    assert guard.before(provider_call('job-4', limits={'rpm': 1}, model='n')) is None
    with pytest.raises(EntryUnavailable):
        guard.before(provider_call('job-5', limits={'rpm': 1}, model='n'))
    assert guard.before(provider_call('job-6', model='free')) is None
    assert set(window._logs) == {'p/m', 'p/n'}


@pytest.mark.slow
def test_jobs_over_the_limit_wait_their_turn_and_no_window_sees_more_than_the_limit(
    make_runtime,
):
    rt = make_runtime(
        registry=fast_registry(),
        AIJOB_RATE_LIMITS='{"synthetic/synthetic-1": {"rpm": 3}}',
        AIJOB_RATE_LIMIT_WINDOW_MS='600',
        AIJOB_RATE_LIMIT_MARGIN_MS='100',
        **FAST_SETTINGS,
    )
    calls = []
    provider = rt.ai.gateway.provider_for(rt.registry.get('synthetic'))
    generate = provider.generate

    def timed(request, ctx):
        calls.append(time.monotonic())
        return generate(request, ctx)

    provider.generate = timed
    with rt.store.connection():
        rt.start_background()
        jobs = [create_job(rt, user_id='u%d' % i) for i in range(10)]
        done = [wait_terminal(rt, job.id, timeout=30) for job in jobs]
        assert [job.lifecycle_status for job in done] == ['succeeded'] * 10
        assert [job.retry_count for job in done] == [0] * 10
        deferred = AiJobEvent.select().where(AiJobEvent.kind == 'deferred').count()
        assert deferred >= 7  # all but the first three waited at least once
        reasons = {
            e.detail['reason'] for e in AiJobEvent.select().where(AiJobEvent.kind == 'deferred')
        }
        assert reasons == {'rate_limit'}
        assert AiJob.select().where(AiJob.defer_count > 0).count() >= 7
    calls.sort()
    assert len(calls) == 10
    assert all(calls[i + 3] - calls[i] >= 0.6 for i in range(len(calls) - 3))


def test_the_shared_log_lives_until_its_last_booked_slot_has_left_the_window():
    require_servers('redis')
    prefix = 'aijob-test-rl-%s' % uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        window = RedisWindow(client, prefix, 300, 50)
        waits = [window.reserve('p/m', 'j%d' % i, 0, Limits(rpm=1), book=True) for i in range(6)]
        last_ms = waits[-1].wait_ms
        assert last_ms >= 1400  # five slots booked one window apart
        window.reserve('p/m', 'late-comer', 0, Limits(rpm=1), book=False)
        for key in window.keys('p/m'):
            assert client.pttl(key) >= last_ms + 300
    finally:
        client.close()
        delete_redis_keys(prefix)
