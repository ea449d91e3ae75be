"""Rate limits (issue 21 item 4, issue 31 item 4): the log of requests counted from their
reservation until a window after their response, and the queue of booked places, in Redis (one Lua
script shared by every process) and in the process, exact under concurrency and whatever the delay
before the provider; the guard around the engine's calls, on both backend pairs."""

import threading
import time
import types
import uuid

import pytest
import redis

from engine.core.errors import ConfigError
from engine.core.models import AiJob, AiJobEvent
from engine.execution.providers import EntryUnavailable, ProviderCall, ProviderRequest, Usage
from engine.extensions import load_config
from engine.features.gateway.providers_config import Limits
from engine.features.rate_limits.limiter import (
    LATE_MS,
    LocalWindow,
    RateLimitGuard,
    RedisWindow,
)
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers
from tests.support.fake_openai import fake  # noqa: F401
from tests.support.helpers import create_job, wait_until
from tests.support.provider_configs import plugin_provider
from tests.support.rate_limited import create_jobs, limit_fake, settings
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

HOLD_MS = 60_000  # a call's deadline: how long a request with no response may count


class ManualClock:
    """The local kind's clock, moved only by the test: what a test proves of the times a window
    gives does not depend on how fast this machine runs it."""

    def __init__(self):
        self._now = 1000.0  # seconds; any start will do
        self._lock = threading.Lock()

    def now(self):
        with self._lock:
            return self._now

    def sleep(self, seconds):
        with self._lock:
            self._now += seconds


class RealClock:
    """The Redis kind's: the script reads Redis's own clock, which a test cannot move."""

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


@pytest.fixture(params=['local', 'redis'])
def make_window(request):
    """``make_window(window_ms, late_ms=LATE_MS)``: a fresh limiter of either kind; each call of
    the Redis kind is a client of its own (as another process would be), on the same keys.
    ``make_window.clock`` is the windows' clock (``now()`` in seconds, ``sleep(seconds)``): the
    local kind's is a ManualClock, so its times are exact; the Redis kind's runs on, so its
    checks allow for the time this test itself spends between calls (measured, not guessed)."""
    if request.param == 'local':
        shared = {}
        clock = ManualClock()

        def make(window_ms, late_ms=LATE_MS):
            if 'window' not in shared:
                shared['window'] = LocalWindow(window_ms, late_ms, clock=clock.now)
            return shared['window']

        make.clock = clock
        yield make
        return
    require_servers('redis')
    prefix = 'aijob-test-rl-%s' % uuid.uuid4().hex[:8]
    clients = []

    def make(window_ms, late_ms=LATE_MS):
        clients.append(redis.Redis.from_url(REDIS_URL, decode_responses=True))
        return RedisWindow(clients[-1], prefix, window_ms, late_ms)

    make.clock = RealClock()
    yield make
    for client in clients:
        client.close()
    delete_redis_keys(prefix)


def since_ms(clock, started):
    """The milliseconds ``clock`` moved since ``started``, rounded up, plus one for the window's
    own reading of its clock to the millisecond: the most a wait can have shrunk meanwhile."""
    return int((clock.now() - started) * 1000) + 2


def reserve(window, member, limits, book=True, tokens=0, hold_ms=HOLD_MS):
    return window.reserve('p/m', member, tokens, limits, book, hold_ms)


def slot_of(member):
    return int(float(member.rsplit('@', 1)[1]))


def test_no_window_ever_holds_more_than_the_limit_under_concurrent_reservations(make_window):
    limit, window_ms = 25, 400
    windows = [make_window(window_ms) for _ in range(4)]
    clock = make_window.clock
    admitted, lock = [], threading.Lock()
    stop_at = clock.now() + 1.3

    def hammer(i):
        window, n = windows[i % len(windows)], 0
        while clock.now() < stop_at:
            clock.sleep(0.001)  # time moves on (the local kind's only as the threads move it)
            n += 1
            slot = reserve(window, 't%d-%d' % (i, n), Limits(rpm=limit), book=False)
            if slot.wait_ms == 0:
                window.settle('p/m', slot.member)  # answered at once
                with lock:
                    admitted.append(slot_of(slot.member))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    admitted.sort()
    # Any limit + 1 reservations span more than the window: no window holds limit + 1.
    assert all(admitted[i + limit] - admitted[i] >= window_ms for i in range(len(admitted) - limit))
    assert len(admitted) > limit  # the window rolled on: requests that left made room
    print('admitted %d in 1.3 s at %d per %d ms' % (len(admitted), limit, window_ms))


def test_a_request_counts_until_a_window_after_its_response_however_late_that_is(make_window):
    window, clock = make_window(200), make_window.clock
    one = Limits(rpm=1)
    first = reserve(window, 'a', one)
    assert first.wait_ms == 0
    clock.sleep(0.4)  # twice the window, and no response yet: the provider may not have it yet
    assert reserve(window, 'b', one).wait_ms > 0
    settled = clock.now()
    window.settle('p/m', first.member)
    wait_ms = reserve(window, 'b', one).wait_ms
    assert 201 - since_ms(clock, settled) <= wait_ms <= 201  # a window from its response
    clock.sleep(0.21)
    assert reserve(window, 'b', one).wait_ms == 0


def test_a_request_never_sent_is_released_at_once(make_window):
    window = make_window(60_000)
    one = Limits(rpm=1)
    first = reserve(window, 'a', one, book=False)
    assert reserve(window, 'b', one, book=False).wait_ms > 0
    window.release('p/m', first.member)
    assert reserve(window, 'b', one, book=False).wait_ms == 0


def test_waiting_calls_keep_their_places_in_order_however_late_they_come_back(make_window):
    window, clock = make_window(300), make_window.clock
    two = Limits(rpm=2)
    started = clock.now()
    for member in ('a', 'b'):
        slot = reserve(window, member, two)
        assert slot.wait_ms == 0
        window.settle('p/m', slot.member)
    c, d, e = (reserve(window, member, two).wait_ms for member in 'cde')
    # c and d fit when a and b leave (a window and a millisecond after their responses; d's
    # time a millisecond after c's at least, as each place's follows the ones before it), e
    # when c does. A wait is the time given less the time already past, so each lower bound
    # allows for the time this test spent since it began (none on the local kind's clock).
    late = since_ms(clock, started)
    assert 301 - late <= c <= 301 and c + 1 - late <= d <= 302 and 300 - late <= e - c <= 300
    early = reserve(window, 'c', two)
    assert 0 < early.wait_ms <= c  # too early: it keeps its place and is told the rest
    # Every place's time is past: all three come back late, by far less than LATE_MS (10 s,
    # after which a place lapses), however slowly the Redis kind's real sleep returns.
    clock.sleep(e / 1000.0 + 0.1)
    assert reserve(window, 'f', two).wait_ms > 0  # a newcomer queues behind them
    assert reserve(window, 'e', two).wait_ms > 0  # e is behind c and d, who have not come back
    for member in 'cd':
        taken = reserve(window, member, two)
        assert taken.wait_ms == 0 and taken.member.startswith(member + '@')  # late, yet served
        window.settle('p/m', taken.member)
    assert reserve(window, 'e', two).wait_ms > 0  # c and d fill the window again


def test_a_place_whose_call_never_comes_back_lapses_and_one_that_does_is_kept(make_window):
    # A place lapses ``late_ms`` after its time: 'kept' comes back half of that after its
    # time, 'gone''s place lapses, and 'kept''s (given anew when it came back) still holds a
    # fifth of it later. Those margins (1.5 s and 0.6 s) are what a slow real sleep of the
    # Redis kind may overrun by; the local kind's clock does not run on.
    late_ms = 3000
    window, clock = make_window(100, late_ms=late_ms), make_window.clock
    one = Limits(rpm=1)
    window.settle('p/m', reserve(window, 'a', one).member)
    assert reserve(window, 'gone', one).wait_ms > 0  # booked, never back
    assert reserve(window, 'kept', one).wait_ms > 0
    clock.sleep(late_ms / 2000.0)
    assert reserve(window, 'kept', one).wait_ms > 0  # back in time, still behind 'gone'
    clock.sleep(late_ms * 0.8 / 1000.0)  # past 'gone''s time by more than late_ms: it lapsed
    assert reserve(window, 'kept', one).wait_ms == 0


def test_a_place_is_not_booked_for_a_call_that_may_try_another_entry(make_window):
    window, clock = make_window(300), make_window.clock
    one = Limits(rpm=1)
    window.settle('p/m', reserve(window, 'a', one, book=False).member)
    started = clock.now()
    unbooked = reserve(window, 'b', one, book=False).wait_ms
    booked = reserve(window, 'c', one).wait_ms
    late = since_ms(clock, started)  # what the waits shrank by meanwhile
    assert unbooked - late <= booked <= unbooked  # b took no place: c has the first one
    assert reserve(window, 'd', one).wait_ms >= booked + 300 - since_ms(clock, started)


def test_tokens_are_reserved_at_their_estimate_and_settled_with_the_usage(make_window):
    window = make_window(60_000)
    limits = Limits(tpm=100)
    first = reserve(window, 'a', limits, book=False, tokens=60)
    assert first.wait_ms == 0
    assert reserve(window, 'b', limits, book=False, tokens=60).wait_ms > 0  # 120 > 100
    window.settle('p/m', first.member, 20)  # it used 20 of its 60
    second = reserve(window, 'b', limits, book=False, tokens=60)
    assert second.wait_ms == 0  # 80 <= 100
    window.release('p/m', second.member)  # never sent
    assert reserve(window, 'c', limits, book=False, tokens=80).wait_ms == 0  # 100 <= 100


# Limits are the provider config's models' ``limits``
# (tests/features/gateway/test_gateway_providers.py checks their parsing); the settings that
# said them elsewhere are refused, saying what replaces them.
@pytest.mark.parametrize(
    'env,value,says',
    [
        ('AIJOB_RATE_LIMIT_MARGIN_MS', '0', 'after its response'),
        (
            'AIJOB_RATE_LIMITS',
            '{"synthetic/synthetic-1": {"rpm": 3}}',
            '"limits" in AIJOB_PROVIDERS',
        ),
        ('AIJOB_PRICE_TABLE', '{"*": {"prompt": "1"}}', '"price" in AIJOB_PROVIDERS'),
    ],
)
def test_a_retired_setting_is_refused_at_start_up_with_one_line(env, value, says):
    with pytest.raises(ConfigError) as refused:
        load_config({}, **{env: value})
    message = str(refused.value)
    assert message.startswith('%s is no longer used: ' % env)
    assert '\n' not in message and says in message


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


def test_the_guard_moves_a_call_on_or_books_its_place_and_settles_its_tokens():
    window = LocalWindow(1000)
    guard = RateLimitGuard(window, {'p/m': Limits(rpm=1, tpm=1000)})
    first = provider_call('job-1', max_tokens=90)
    assert guard.before(first) is None
    with pytest.raises(EntryUnavailable) as moved:
        guard.before(provider_call('job-2', has_next_entry=True))
    assert moved.value.reason == 'rate_limit' and moved.value.detail['entry'] == 'p/m'
    with pytest.raises(EntryUnavailable) as waits:
        guard.before(provider_call('job-3'))
    assert waits.value.delay_s == pytest.approx(moved.value.delay_s, abs=0.05)
    log = window._logs['p/m']
    assert [name.split('@')[0] for name in log.counted] == ['job-1:1']
    assert [booking[1] for booking in log.queue] == ['job-3:1']  # no other entry: booked
    assert log.total == 100  # the estimate: 10 + 90
    first.sent = True
    guard.after(first, Usage(10, 5), None)
    assert log.total == 15
    # A call a later guard stopped (never sent) stops counting at once.
    unsent = provider_call('job-7', model='q', limits=Limits(rpm=1))
    assert guard.before(unsent) is None and len(window._logs['p/q'].counted) == 1
    guard.after(unsent, None, EntryUnavailable(1.0, 'budget', {}))
    assert window._logs['p/q'].counted == {}
    # A call's own limits (the provider file's) count as the setting's do; no limit, no count.
    assert guard.before(provider_call('job-4', limits=Limits(rpm=1), model='n')) is None
    with pytest.raises(EntryUnavailable):
        guard.before(provider_call('job-5', limits=Limits(rpm=1), model='n'))
    assert guard.before(provider_call('job-6', model='free')) is None
    assert set(window._logs) == {'p/m', 'p/n', 'p/q'}


@pytest.mark.slow
def test_jobs_over_the_limit_wait_their_turn_and_no_window_sees_more_than_the_limit(
    make_runtime,
):
    rt = make_runtime(
        registry=fast_registry(),
        **plugin_provider(limits={'rpm': 3}),
        AIJOB_RATE_LIMIT_WINDOW_MS='600',
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


def test_the_shared_log_lives_until_its_last_place_could_lapse():
    require_servers('redis')
    prefix = 'aijob-test-rl-%s' % uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        window = RedisWindow(client, prefix, 300)
        first = reserve(window, 'j0', Limits(rpm=1), hold_ms=1000)
        started = time.monotonic()
        window.settle('p/m', first.member)
        waits = [reserve(window, 'j%d' % i, Limits(rpm=1), hold_ms=1000) for i in range(1, 6)]
        last_ms = waits[-1].wait_ms
        # Five places booked one window apart, less the time these calls took.
        assert last_ms >= 5 * 300 + 1 - since_ms(RealClock, started)
        reserve(window, 'late-comer', Limits(rpm=1), book=False, hold_ms=1000)
        for key in window.keys('p/m'):
            assert client.pttl(key) >= last_ms + LATE_MS  # the last place's time, and its lateness
    finally:
        client.close()
        delete_redis_keys(prefix)


@pytest.mark.slow
def test_every_job_runs_under_the_limit_in_one_process_as_serve_runs_them(
    make_runtime,
    fake,  # noqa: F811
):
    """The stall case of issue 31 (32 jobs, 8 per 5 s) with every worker in one process, as
    ``serve`` runs them (and as ``web`` + ``worker`` do on MariaDB + Redis): all succeed, and
    the fake provider, counting arrivals over the same window, never sees one over the limit."""
    limit_fake(fake, 8, 5.0)
    rt = make_runtime(**settings(fake.base_url, 8, 5.0))
    with rt.store.connection():
        rt.start_background()
        create_jobs(rt, 32)

        def finished():
            succeeded = AiJob.select().where(AiJob.lifecycle_status == 'succeeded').count()
            return succeeded == 32 or fake.over_limit

        wait_until(finished, timeout=90, interval=0.2)
        statuses = [job.lifecycle_status for job in AiJob.select(AiJob.lifecycle_status)]
    assert fake.over_limit == 0
    assert statuses == ['succeeded'] * 32 and len(fake.answered_at) == 32
