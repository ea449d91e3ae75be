"""The live text of a running job on its stream (docs/architecture.md, decision 15), on both
backend pairs: a fake provider streams 200 chunks and the client gets the whole text in order,
coalesced to at most one message per 100 ms; a reconnect with Last-Event-ID mid-way repeats
nothing and misses nothing; another user's stream is 404; a retry starts its text with
``reset``; event ids and their validation; the text never reaches the logs."""

import contextlib
import json
import logging
import threading
import time
from types import SimpleNamespace

import pytest

from engine.core.registry import JobDefinitionRegistry
from engine.features.streams import stream
from engine.features.streams.channel import (
    RESET,
    MemoryTextChannel,
    RedisTextChannel,
    TextEntry,
)
from engine.features.streams.channel import (
    TEXT as TEXT_ENTRY,
)
from engine.features.streams.pump import INTERVAL_S, DeltaPump
from engine.features.streams.text_feed import TextFollower
from engine.jobtypes.flashcards import flashcard_definition
from tests.support.api import JOBS, Harness
from tests.support.fake_openai import Reply, json_reply
from tests.support.runtimes import FAST_SETTINGS
from tests.support.servers import PrivateRedisCluster, require_binaries

CARDS = {
    'cards': [
        {'question': 'Question %d about the capital of France?' % n, 'answer': 'Paris %d' % n}
        for n in range(14)
    ]
}
TEXT = json.dumps(CARDS)  # about 1000 characters: 200 chunks of 5
CHUNK_DELAY_S = 0.01
TIMING_SLACK_S = 0.005  # the pump's clock and the recorder's are read a few steps apart


@pytest.fixture
def text_api(make_runtime, fake):
    """The API over a runtime whose flashcard jobs call the fake provider; the channel's
    messages are recorded as (time, job ids) when the pump sends them."""
    registry = JobDefinitionRegistry()
    registry.register(flashcard_definition(timeout_ms=20_000, max_retries=2, backoff_ms=20))
    with contextlib.ExitStack() as stack:
        runtime = make_runtime(
            registry=registry,
            AIJOB_PROVIDER_BASE_URL=fake.base_url,
            AIJOB_PROVIDER_MODEL='fake-model',
            AIJOB_PLATFORM_API_KEY='sk-platform-text-0000',
            **FAST_SETTINGS,
        )
        stack.enter_context(runtime.store.connection())
        stack.callback(runtime.stop_background, timeout_s=5)
        api = Harness(runtime)
        api.sent = []
        channel = runtime.features['streams'].channel
        append_many = channel.append_many

        def recording(messages):
            api.sent.append((time.monotonic(), [m[0] for m in messages]))
            return append_many(messages)

        channel.append_many = recording
        yield api


def create_flashcards(api, client=None):
    body = {
        'jobType': 'flashcard_generation',
        'targetType': 'note',
        'targetId': 'n1',
        'input': {'text': 'Paris is the capital of France.', 'maxCards': 20},
    }
    response = (client or api.a).post(JOBS, body)
    assert response.status == 201, response
    return response.json['jobId']


def stream_path(job_id):
    return JOBS + '/' + job_id + '/stream'


def parse_block(block):
    fields = {}
    for line in block.split('\n'):
        if not line or line.startswith(':'):
            continue
        name, _, value = line.partition(': ')
        fields[name] = value
    if 'data' in fields:
        fields['data'] = json.loads(fields['data'])
    return fields


class Reader:
    """A stream read on a thread of its own: every event with the time it arrived; ``stop_after``
    delta events it hangs up, as a client that lost its connection."""

    def __init__(self, client, job_id, last_event_id=None, stop_after=None):
        headers = {'Last-Event-ID': last_event_id} if last_event_id is not None else {}
        self.response = client.request('GET', stream_path(job_id), headers=headers, stream=True)
        assert self.response.status == 200, self.response.status
        self.events = []  # (arrival time, fields)
        self.stop_after = stop_after
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        deltas = 0
        for chunk in self.response.chunks:
            for block in chunk.decode('utf-8').split('\n\n'):
                fields = parse_block(block)
                if 'event' not in fields:
                    continue
                self.events.append((time.monotonic(), fields))
                deltas += fields['event'] == 'delta'
                if self.stop_after is not None and deltas >= self.stop_after:
                    self.response.close()
                    return
        self.response.close()

    def join(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive()
        return [fields for _, fields in self.events]

    def deltas(self):
        return [(at, f) for at, f in self.events if f['event'] == 'delta']


def assert_contiguous(deltas, text, attempt=1):
    """The delta events carry ``text`` from its start, in order, each piece once."""
    offset = 0
    for fields in deltas:
        data = fields['data']
        assert (data['attempt'], data['offset']) == (attempt, offset), data
        offset += len(data['text'])
        assert fields['id'].endswith('-%d-%d' % (attempt, offset)), fields['id']
    assert ''.join(f['data']['text'] for f in deltas) == text


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.slow
def test_200_chunks_arrive_whole_in_order_at_most_one_message_per_100_ms(text_api, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=CHUNK_DELAY_S))
    job_id = create_flashcards(text_api)
    reader = Reader(text_api.a, job_id)
    wait_for(lambda: reader.events)  # open (its opening status read) before the job starts
    text_api.runtime.start_background()
    events = reader.join()
    kinds = [f['event'] for f in events]
    assert kinds[0] == 'status' and kinds[-2:] == ['succeeded', 'status']
    assert events[-1]['data']['lifecycleStatus'] == 'succeeded'
    # Every delta before the job's end, after its start; the text whole and in order.
    deltas = [f for f in events if f['event'] == 'delta']
    assert kinds.index('started') < kinds.index('delta')
    assert max(i for i, k in enumerate(kinds) if k == 'delta') < kinds.index('succeeded')
    assert_contiguous(deltas, TEXT)
    # Coalesced: the worker sent this job's messages at least 100 ms apart (200 chunks in about
    # 2 s: about 20 messages), and the client got no more messages than that.
    sent = [at for at, jobs in text_api.sent if job_id in jobs]
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= INTERVAL_S - TIMING_SLACK_S, gaps
    assert len(deltas) == len(sent) < 200 // 4
    arrived = [at for at, _ in reader.deltas()]
    assert len(arrived) <= 1 + (arrived[-1] - arrived[0]) / (INTERVAL_S - TIMING_SLACK_S)
    # History events after the first delta carry the text position in their ids too.
    succeeded = next(f for f in events if f['event'] == 'succeeded')
    assert succeeded['id'] == '%d-1-%d' % (succeeded['data']['id'], len(TEXT))


@pytest.mark.slow
def test_a_reconnect_mid_way_repeats_nothing_and_misses_nothing(text_api, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=CHUNK_DELAY_S))
    job_id = create_flashcards(text_api)
    text_api.runtime.start_background()
    first = Reader(text_api.a, job_id, stop_after=4)
    before = first.join()
    last_id = before[-1]['id']
    assert before[-1]['event'] == 'delta' and last_id.count('-') == 2
    assert text_api.runtime.features['streams'].watch.count == 0  # the hang-up released its place
    second = Reader(text_api.a, job_id, last_event_id=last_id)
    after = second.join()
    assert after[-1]['data']['lifecycleStatus'] == 'succeeded'
    deltas = [f for f in before + after if f['event'] == 'delta']
    assert_contiguous(deltas, TEXT)
    # History ids too: nothing the first connection got comes again.
    history = [f['data']['id'] for f in before + after if f['event'] not in ('delta', 'status')]
    assert history == sorted(set(history))
    # After the job's end, a reconnect with a delta id gets the rest of the history and the
    # final status, as today, and no text (its ids keep the text it has); with the last id, 204.
    rest = Reader(text_api.a, job_id, last_event_id=last_id).join()
    assert [f['event'] for f in rest if f['event'] == 'delta'] == []
    final_history_id = after[-1]['id'].split('-')[0]
    text_part = last_id.split('-', 1)[1]
    assert (rest[-1]['event'], rest[-1]['id']) == ('status', final_history_id + '-' + text_part)
    done = text_api.a.get(stream_path(job_id), headers={'Last-Event-ID': after[-1]['id']})
    assert (done.status, done.body) == (204, b'')


@pytest.mark.slow
def test_a_fresh_stream_mid_way_gets_the_text_so_far_then_the_rest(text_api, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=CHUNK_DELAY_S))
    job_id = create_flashcards(text_api)
    text_api.runtime.start_background()
    wait_for(lambda: any(job_id in jobs for _, jobs in text_api.sent))
    events = Reader(text_api.admin, job_id).join()  # an admin sees any job's text
    assert events[0]['event'] == 'status'
    assert_contiguous([f for f in events if f['event'] == 'delta'], TEXT)


@pytest.mark.slow
def test_another_users_stream_of_a_job_with_text_is_404(text_api, fake):
    fake.script(json_reply(CARDS, chunks=200, delay_s=CHUNK_DELAY_S))
    job_id = create_flashcards(text_api)
    text_api.runtime.start_background()
    wait_for(lambda: any(job_id in jobs for _, jobs in text_api.sent))
    for last_event_id in (None, '1-1-0'):
        headers = {'Last-Event-ID': last_event_id} if last_event_id else {}
        response = text_api.b.get(stream_path(job_id), headers=headers)
        assert (response.status, response.error_code) == (404, 'JOB_NOT_FOUND')
        assert b'cards' not in response.body


@pytest.mark.slow
def test_a_retry_starts_its_text_with_reset(text_api, fake):
    broken = TEXT[:300]
    fake.script(
        Reply(content=broken, chunks=30, delay_s=CHUNK_DELAY_S, finish_reason=None),
        json_reply(CARDS, chunks=50, delay_s=CHUNK_DELAY_S),
    )
    job_id = create_flashcards(text_api)
    reader = Reader(text_api.a, job_id)
    wait_for(lambda: reader.events)
    text_api.runtime.start_background()
    events = reader.join()
    kinds = [f['event'] for f in events]
    assert events[-1]['data']['lifecycleStatus'] == 'succeeded'
    reset = kinds.index('reset')
    assert events[reset]['data'] == {'attempt': 2}
    assert events[reset]['id'].endswith('-2-0')
    assert kinds.index('retry_scheduled') < reset  # the failed call's end shows first
    assert_contiguous([f for f in events[:reset] if f['event'] == 'delta'], broken, attempt=1)
    assert_contiguous([f for f in events[reset:] if f['event'] == 'delta'], TEXT, attempt=2)


class _Feed:
    def follow(self, waiter, cursor):
        pass

    def unfollow(self, waiter):
        pass


def test_a_reconnect_from_an_earlier_attempt_is_told_of_the_reset_and_gets_the_new_text():
    channel = MemoryTextChannel(ttl_ms=60_000, max_entries=100)
    first, _ = channel.append_many([('job-1', None, 0, 'abc'), ('job-1', 1, 3, 'def')])
    second, _ = channel.append_many([('job-1', None, 0, 'xy'), ('job-1', 2, 2, 'z')])
    assert (first, second) == (1, 2)
    waiter = SimpleNamespace(job_id='job-1')

    def events(attempt, offset):
        follower = TextFollower(channel, _Feed(), waiter, attempt, offset)
        return [(name, data, a, o) for name, data, a, o in follower.events()]

    assert events(1, 3) == [
        ('delta', {'attempt': 1, 'offset': 3, 'text': 'def'}, 1, 6),
        ('reset', {'attempt': 2}, 2, 0),
        ('delta', {'attempt': 2, 'offset': 0, 'text': 'xy'}, 2, 2),
        ('delta', {'attempt': 2, 'offset': 2, 'text': 'z'}, 2, 3),
    ]
    assert events(1, 6)[0] == ('reset', {'attempt': 2}, 2, 0)
    assert events(2, 2) == [('delta', {'attempt': 2, 'offset': 2, 'text': 'z'}, 2, 3)]
    assert events(2, 3) == []
    # No text yet (a fresh stream, or a plain history id): the current attempt from its start.
    assert [data['text'] for _, data, _, _ in events(None, 0)] == ['xy', 'z']


@pytest.mark.slow
def test_the_text_never_reaches_the_logs(text_api, fake, caplog):
    caplog.set_level(logging.DEBUG)
    fake.script(json_reply(CARDS, chunks=20, delay_s=CHUNK_DELAY_S))
    job_id = create_flashcards(text_api)
    reader = Reader(text_api.a, job_id)
    text_api.runtime.start_background()
    events = reader.join()
    assert [f for f in events if f['event'] == 'delta']
    ours = [r for r in caplog.records if r.name == 'aijob']  # the service's own log lines
    assert any(r.getMessage() == 'http.stream_ended' for r in ours)
    logged = [r.getMessage() + json.dumps(getattr(r, 'fields', {}), default=str) for r in ours]
    assert 'Question 3' not in '\n'.join(logged)


@pytest.mark.parametrize(
    'raw,position',
    [
        ('42', (42, None, 0)),
        ('42-1-0', (42, 1, 0)),
        ('0-3-1234', (0, 3, 1234)),
    ],
)
def test_event_ids_resume_a_history_position_or_a_text_position(raw, position):
    parsed = stream.parse_last_event_id(raw)
    assert tuple(parsed) == position and parsed.event_id() == raw


@pytest.mark.parametrize('raw', ['1-0-5', '1-1', '1-1-', '-1-1-1', '1-1-1-1', '1-x-1', '١'])
def test_other_event_ids_are_refused(raw):
    from engine.core.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        stream.parse_last_event_id(raw)


class _Channel:
    """A channel that records what the pump sends, for the pump's own rules."""

    def __init__(self):
        self.messages = []

    def append_many(self, messages):
        self.messages.extend(messages)
        return [1 if attempt is None else attempt for _, attempt, _, _ in messages]


def test_the_pump_sends_512_characters_at_once_without_waiting_out_the_interval():
    channel = _Channel()
    pump = DeltaPump(channel, interval_s=10.0)
    sink = pump.open('job-1')
    sink.write('a')  # the first message goes at once
    wait_for(lambda: channel.messages)
    sink.write('b' * 600)  # full: goes now, long before the 10 s interval
    wait_for(lambda: len(channel.messages) == 2, timeout=2.0)
    assert channel.messages == [('job-1', None, 0, 'a'), ('job-1', 1, 1, 'b' * 600)]
    pump.stop()


class _SlowChannel(_Channel):
    """Records when each message went out; each round trip takes ``delay_s``."""

    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s
        self.sent_at = []

    def append_many(self, messages):
        now = time.monotonic()
        self.sent_at.extend((now, m[0]) for m in messages)
        time.sleep(self.delay_s)
        return super().append_many(messages)


def test_many_sinks_writing_through_slow_round_trips_keep_the_pace_and_lose_nothing():
    """40 calls write every 2 ms while each round trip takes 15 ms: each call's messages come
    at least the interval apart (counted from the end of the send before), in order, and
    together they are its whole text; one call's text keeps filling its sink past MAX_CHARS."""
    channel = _SlowChannel(delay_s=0.015)
    pump = DeltaPump(channel, interval_s=0.05, max_chars=200)
    sinks = [pump.open('job-%d' % n) for n in range(40)]
    written = {sink.job_id: [] for sink in sinks}
    for step in range(150):
        for sink in sinks:
            text = '%s.' % step if sink.job_id != 'job-0' else 'x' * 30  # job-0 fills up
            sink.write(text)
            written[sink.job_id].append(text)
        time.sleep(0.002)
    for sink in sinks:
        sink.close()
    pump.stop()
    for sink in sinks:
        mine = [m for m in channel.messages if m[0] == sink.job_id]
        assert ''.join(m[3] for m in mine) == ''.join(written[sink.job_id])
        assert [m[2] for m in mine] == [sum(len(m[3]) for m in mine[:i]) for i in range(len(mine))]
        times = [t for t, job in channel.sent_at if job == sink.job_id]
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        if sink.job_id != 'job-0':  # a full sink's messages go at once (the test above)
            assert min(gaps) >= 0.05 + 0.015 - 0.002, sink.job_id


@pytest.fixture
def channel(backend):
    """The text channel of the backend pair: in the process, or Redis under the test's prefix."""
    if backend.redis_url is None:
        made = MemoryTextChannel(ttl_ms=60_000, max_entries=50)
    else:
        made = RedisTextChannel(backend.redis_url, backend.prefix, ttl_ms=60_000, max_entries=50)
    yield made
    made.close()


def test_a_channel_keeps_a_jobs_entries_in_order_capped_and_expiring(channel):
    begun = channel.append_many([('job-a', None, 0, 'x'), ('job-b', None, 0, 'b')])
    assert begun == [1, 1]
    channel.append_many([('job-a', 1, i, 'x') for i in range(1, 500)])
    entries = channel.read('job-a')
    # Capped (Redis trims whole nodes, so approximately): the newest kept, in order.
    assert 50 <= len(entries) < 500 and entries[-1].offset == 499
    assert [e.offset for e in entries] == sorted(e.offset for e in entries)
    assert channel.read('job-a', after=entries[-2].id) == entries[-1:]
    assert channel.wait_new({'job-a': entries[-1].id, 'job-b': None}, 0.05) == {
        'job-b': channel.read('job-b')[-1].id
    }
    # The next attempt begins with its first message, announced by a reset.
    assert channel.append_many([('job-a', None, 0, 'y')]) == [2]
    reset, text = channel.read('job-a', after=entries[-1].id)
    assert reset == TextEntry(reset.id, RESET, 2)
    assert (text.kind, text.attempt, text.offset, text.text) == (TEXT_ENTRY, 2, 0, 'y')
    if isinstance(channel, RedisTextChannel):
        assert 0 < channel.redis.pttl(channel.key('job-a')) <= 60_000
        assert 0 < channel.redis.pttl(channel.key('job-b')) <= 60_000
    assert [(e.kind, e.attempt, e.offset, e.text) for e in channel.read('job-b')] == [
        (TEXT_ENTRY, 1, 0, 'b')
    ]
    # Messages of another attempt and of a new job in the same call.
    last = channel.read('job-a')[-1].id
    assert channel.append_many([('job-a', None, 0, 'new'), ('job-c', None, 0, 'c')]) == [3, 1]
    assert [(e.kind, e.attempt, e.offset, e.text) for e in channel.read('job-a', after=last)] == [
        (RESET, 3, 0, ''),
        (TEXT_ENTRY, 3, 0, 'new'),
    ]
    assert [(e.kind, e.attempt, e.text) for e in channel.read('job-c')] == [(TEXT_ENTRY, 1, 'c')]


@pytest.mark.slow
def test_the_channel_writes_a_rounds_messages_in_one_call_on_a_cluster(tmp_path):
    """The messages of one pump round go in one script call (beginning the attempts of the
    calls' first messages), whose keys share the ``{text}`` hash tag: a Redis Cluster runs it
    on the one node that holds them."""
    require_binaries('redis-server')
    cluster = PrivateRedisCluster(tmp_path / 'cluster', masters=3)
    try:
        cluster.start()
        channel = RedisTextChannel(cluster.url, 'text', ttl_ms=60_000, max_entries=50)
        jobs = ['job-%d' % n for n in range(20)]
        assert channel.append_many([(job, None, 0, 'hello ') for job in jobs]) == [1] * 20
        assert channel.append_many([(job, 1, 6, job) for job in jobs]) == [1] * 20
        for job in jobs:
            assert ''.join(e.text for e in channel.read(job)) == 'hello ' + job
            assert 0 < channel.redis.pttl(channel.key(job)) <= 60_000
        channel.close()
    finally:
        cluster.stop()


def test_the_attempt_counter_outlives_the_text():
    now = [0.0]
    channel = MemoryTextChannel(ttl_ms=1000, max_entries=10, clock=lambda: now[0])
    channel.append_many([('job-1', None, 0, 'abc')])
    now[0] = 5.0  # the text has expired (written on the next write of any job)
    assert channel.append_many([('job-1', None, 0, 'd')]) == [2]
    assert [e.kind for e in channel.read('job-1')] == [RESET, TEXT_ENTRY]
