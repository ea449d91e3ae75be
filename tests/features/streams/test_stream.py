"""The live event stream of a job, ``GET /api/ai/jobs/{id}/stream`` (architecture decision 15),
through WSGI in-process on both backend pairs: every change of a job that retries and succeeds,
in order, then its final status and the end; ``Last-Event-ID`` resumes without a repeat; the
heartbeat, the time cap, the per-user cap and who may watch; and 300 streams in a real ``serve``
process (gevent: greenlets, not threads)."""

import contextlib
import json
import socket
import threading
import time

import pytest

from engine.core.history import JobHistory
from engine.features.streams import stream
from tests.kernel.http.test_web_tier import create, serve  # noqa: F401
from tests.support.api import JOBS, Harness
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal
from tests.support.servers import http

RETRIES_THEN_SUCCEEDS = {
    'failWith': 'PROVIDER_UNAVAILABLE',
    'failTimes': 1,
    'progressSteps': 4,
    'sleepMs': 100,
    'output': {'ok': True},
}


@pytest.fixture
def make_stream_api(make_runtime):
    """``make_stream_api(**settings)``: the API over a fast runtime whose background is not
    started (``api.runtime.start_background()`` starts it; it is stopped in the end)."""
    with contextlib.ExitStack() as stack:

        def make(**settings):
            runtime = make_runtime(registry=fast_registry(), **{**FAST_SETTINGS, **settings})
            stack.enter_context(runtime.store.connection())
            stack.callback(runtime.stop_background, timeout_s=5)
            return Harness(runtime)

        yield make


def stream_path(job_id):
    return JOBS + '/' + job_id + '/stream'


def parse(raw):
    """The messages of an event stream as dicts (id, event, data), comments as {'comment'}."""
    messages = []
    for block in raw.decode('utf-8').split('\n\n'):
        if not block:
            continue
        fields = {}
        for line in block.split('\n'):
            if line.startswith(':'):
                fields['comment'] = line[1:].strip()
                continue
            name, _, value = line.partition(': ')
            fields[name] = int(value) if name in ('id', 'retry') else value
        if 'data' in fields:
            fields['data'] = json.loads(fields['data'])
        messages.append(fields)
    return messages


def events(messages):
    return [m for m in messages if 'event' in m]


def read_stream(client, job_id, last_event_id=None):
    headers = {'Last-Event-ID': str(last_event_id)} if last_event_id is not None else {}
    response = client.get(stream_path(job_id), headers=headers)
    assert response.status == 200, response
    assert response.headers['content-type'].startswith('text/event-stream')
    return parse(response.body)


@pytest.mark.slow
def test_a_job_that_retries_and_succeeds_streams_every_change_in_order_then_ends(
    make_stream_api,
):
    api = make_stream_api()
    job_id = api.create(input=RETRIES_THEN_SUCCEEDS)
    got = {}
    reader = threading.Thread(target=lambda: got.update(messages=read_stream(api.a, job_id)))
    reader.start()
    time.sleep(0.3)  # the stream is open, and waiting, before the job starts
    api.runtime.start_background()
    reader.join(30)
    assert not reader.is_alive()
    messages = got['messages']
    assert messages[0] == {'retry': 2000}
    opening, *changes, final = events(messages)
    assert (opening['event'], opening['data']['lifecycleStatus']) == ('status', 'queued')
    assert (final['event'], final['data']['lifecycleStatus']) == ('status', 'succeeded')
    assert final['data']['result']['artifactCount'] == 1
    assert final['data'] == api.a.get(JOBS + '/' + job_id).json
    # Exactly the job's history after the opening status, in id order, each as its owner sees it.
    history = JobHistory(api.runtime.store).list(job_id, after_id=opening['id'])
    assert [(m['id'], m['event'], m['data']) for m in changes] == [
        (row.id, row.kind, row.public()) for row in history
    ]
    kinds = [m['event'] for m in changes]
    assert kinds[-1] == 'succeeded' and final['id'] == changes[-1]['id']
    order = [kinds.index(k) for k in ('started', 'progress', 'retry_scheduled', 'succeeded')]
    assert order == sorted(order), kinds
    assert [m['id'] for m in changes] == sorted({m['id'] for m in changes})  # increasing
    assert all('worker' not in m['data']['detail'] for m in changes)  # the owner's view


@pytest.mark.slow
def test_resuming_with_last_event_id_repeats_nothing(make_stream_api):
    api = make_stream_api()
    job_id = api.create(input=RETRIES_THEN_SUCCEEDS)
    api.runtime.start_background()
    wait_terminal(api.runtime, job_id)
    whole = events(read_stream(api.a, job_id, last_event_id=0))  # everything since the start
    assert [m['event'] for m in whole][:1] == ['created']
    for cut in range(len(whole) - 2):  # a client that lost its connection after event ``cut``
        resumed = events(read_stream(api.a, job_id, last_event_id=whole[cut]['id']))
        assert resumed == whole[cut + 1 :]
    # After the last event of a finished job nothing will come: 204 stops an EventSource.
    done = api.a.get(stream_path(job_id), headers={'Last-Event-ID': str(whole[-1]['id'])})
    assert (done.status, done.body) == (204, b'')
    # A fresh stream of a finished job: its status at once, then the end.
    (fresh,) = events(read_stream(api.a, job_id))
    assert fresh == dict(whole[-1])


@pytest.mark.slow
def test_a_history_longer_than_one_read_is_sent_whole(make_stream_api, monkeypatch):
    api = make_stream_api()
    job_id = api.create(input=RETRIES_THEN_SUCCEEDS)
    api.runtime.start_background()
    wait_terminal(api.runtime, job_id)
    whole = events(read_stream(api.a, job_id, last_event_id=0))
    monkeypatch.setattr(stream, 'ROWS_PER_READ', 2)  # read the history two rows at a time
    assert events(read_stream(api.a, job_id, last_event_id=0)) == whole
    assert len(whole) > 5


def test_an_idle_stream_gets_heartbeats_and_ends_at_its_time_cap(make_stream_api):
    api = make_stream_api(AIJOB_STREAM_HEARTBEAT_MS='150', AIJOB_STREAM_MAX_S='1')
    job_id = api.create()  # queued; no worker runs
    messages = read_stream(api.a, job_id)
    (opening,) = events(messages)
    assert opening['data']['lifecycleStatus'] == 'queued'
    # It stayed open (beats 150 ms apart within the 1 s cap: six or so; half of them is
    # enough to show it), then ended with the job unchanged: at its cap, and the client resumes.
    beats = [m for m in messages if m.get('comment') == 'keepalive']
    assert len(beats) >= 3, messages
    assert api.a.get(JOBS + '/' + job_id).json['lifecycleStatus'] == 'queued'
    assert api.runtime.features['streams'].watch.count == 0


def test_streams_are_capped_per_user_and_released_when_the_client_goes(make_stream_api):
    api = make_stream_api(AIJOB_MAX_STREAMS_PER_USER='2')
    job_id = api.create()
    other = api.create(client=api.b)
    opened = [api.a.request('GET', stream_path(job_id), stream=True) for _ in range(2)]
    assert [s.status for s in opened] == [200, 200]
    refused = api.a.get(stream_path(job_id))
    assert (refused.status, refused.error_code) == (429, 'TOO_MANY_STREAMS'), refused
    assert refused.headers['retry-after'] == '5'
    theirs = api.b.request('GET', stream_path(other), stream=True)  # another user's own cap
    assert theirs.status == 200
    assert api.runtime.features['streams'].watch.count == 3
    opened[0].close()  # the client went away
    again = api.a.request('GET', stream_path(job_id), stream=True)
    assert again.status == 200
    for response in (opened[1], theirs, again):
        response.close()
    assert api.runtime.features['streams'].watch.count == 0


def test_only_the_owner_or_an_admin_may_watch(make_stream_api):
    api = make_stream_api()
    job_id = api.create()
    api.runtime.service.cancel_job(job_id)  # a finished job: a stream of it ends at once
    for client, status in ((api.b, 404), (api.anon, 401)):
        response = client.get(stream_path(job_id))
        assert response.status == status, response
    assert api.a.get(stream_path('no-such-job')).error_code == 'JOB_NOT_FOUND'
    (status,) = events(read_stream(api.admin, job_id))
    assert status['data']['lifecycleStatus'] == 'cancelled'
    # ids past the largest row id (2**63 - 1) match the pattern but name no event
    for bad in ('x', '-1', '1.5', '9' * 20, '9' * 19, '9223372036854775808-1-0'):
        response = api.a.get(stream_path(job_id), headers={'Last-Event-ID': bad})
        assert (response.status, response.error_code) == (400, 'INVALID_REQUEST'), bad
    assert api.runtime.features['streams'].watch.count == 0


def test_a_cancelled_running_job_streams_its_cancel_and_ends(make_stream_api):
    api = make_stream_api()
    job_id = api.create(input={'sleepMs': 5000})
    api.runtime.start_background()
    got = {}
    reader = threading.Thread(target=lambda: got.update(messages=read_stream(api.a, job_id)))
    reader.start()
    deadline = time.monotonic() + 10
    streams = api.runtime.features['streams'].watch
    while (
        api.a.get(JOBS + '/' + job_id).json['lifecycleStatus'] != 'running'
        or streams.count == 0  # the stream has opened (and read its status)
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert api.a.post(JOBS + '/' + job_id + '/cancel').status in (200, 202)
    reader.join(20)
    kinds = [m['event'] for m in events(got['messages'])]
    assert kinds[-2:] == ['cancelled', 'status']
    assert 'cancel_requested' in kinds


# ---------------------------------------------------------------- a real gevent web tier
def open_raw_stream(port, token, job_id):
    """A stream on a raw socket (HTTP/1.0: the body is the events as sent, ended by a close)."""
    sock = socket.create_connection(('127.0.0.1', port), timeout=60)
    head = 'GET /api/ai/jobs/%s/stream HTTP/1.0\r\nAuthorization: Bearer %s\r\n\r\n' % (
        job_id,
        token,
    )
    sock.sendall(head.encode('latin-1'))
    return sock


def until_opened(sock):
    """What ``sock`` received up to its opening status event (the rest is read later)."""
    received = b''
    while b'event: status' not in received or not received.endswith(b'\n\n'):
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


def rest(sock):
    """Everything ``sock`` still receives until the server closes it."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b''.join(chunks)


def answer(raw):
    head, _, body = raw.partition(b'\r\n\r\n')
    return int(head.split()[1]), head.decode('latin-1').lower(), body


@pytest.mark.slow
def test_300_streams_in_a_serve_process_each_get_every_change_while_healthz_answers(serve):  # noqa: F811
    base, port, token, _ = serve(AIJOB_MAX_STREAMS_PER_USER='1000')
    # The streams are held until the job ends; it runs 10 s, ten times what opening them and the
    # /healthz calls take here (0.8 s measured), so /healthz is answered while all are held.
    job_id = create(base, token, {'sleepMs': 10000, 'progressSteps': 3})
    streams = [open_raw_stream(port, token, job_id) for _ in range(300)]
    openings = [until_opened(sock) for sock in streams]  # all 300 held open at once, then:
    for _ in range(5):
        assert http('GET', base + '/healthz').status == 200
    held = http('GET', base + '/api/ai/jobs/' + job_id, token).json['lifecycleStatus']
    assert held not in ('succeeded', 'failed', 'cancelled')  # the streams were still open
    bodies = [answer(opening + rest(sock)) for sock, opening in zip(streams, openings, strict=True)]
    assert {status for status, _, _ in bodies} == {200}
    final = http('GET', base + '/api/ai/jobs/' + job_id, token).json
    for _, headers, body in bodies:
        assert 'text/event-stream' in headers
        messages = parse(body)
        assert (events(messages)[-1]['event'], events(messages)[-1]['data']) == ('status', final)
    # The streams opened while the job was in one state or another; each got every change after
    # its opening status, so they all end with the same events.
    tails = {json.dumps([m['id'] for m in events(parse(body))][-3:]) for _, _, body in bodies}
    assert len(tails) == 1
    assert [m['event'] for m in events(parse(bodies[0][2]))][-3:-1] == ['progress', 'succeeded']
