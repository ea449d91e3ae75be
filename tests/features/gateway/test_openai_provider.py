"""The OpenAI-compatible provider against a real HTTP server on loopback that speaks the
chat-completions protocol with SSE streaming (tests/fake_openai.py)."""

import json
import socket
import threading
import time

import httpx2
import pytest

from engine.core.errors import (
    ContentSafetyError,
    CredentialError,
    JobCancelledError,
    JobTimeoutError,
    OutputValidationError,
    ProviderError,
    ProviderRequestError,
)
from engine.execution.prompts import default_library
from engine.execution.providers import CallContext, Credential, ProviderRequest
from engine.features.gateway import openai_client
from engine.features.gateway.openai_client import (
    CALLS_PER_POOL,
    WATCH_INTERVAL_S,
    OpenAICompatibleProvider,
    _HttpPools,
    retry_after_seconds,
)
from engine.jobtypes.flashcards import FLASHCARD_JOB_DEFINITION, FLASHCARDS_V1
from tests.support.fake_openai import Reply, error_reply, json_reply
from tests.support.helpers import wait_until
from tests.support.scripted_http import ScriptedServer

CARDS = {
    'cards': [
        {'question': 'Capital of France?', 'answer': 'Paris'},
        {'question': 'Capital of Italy?', 'answer': 'Rome'},
    ]
}
API_KEY = 'sk-test-0123456789abcdef'


@pytest.fixture
def provider(fake):
    prompts = default_library()
    prompts.add(FLASHCARDS_V1)  # what the flashcards plugin registers
    return OpenAICompatibleProvider(
        fake.base_url, 'fake-model', prompts=prompts, read_timeout_s=5.0
    )


def request(
    attempt=1, prompt_version=None, api_key=API_KEY, text='Paris is the capital of France.'
):
    return ProviderRequest(
        job_id='job-1',
        job_type='flashcard_generation',
        attempt=attempt,
        input={'text': text, 'maxCards': 3},
        definition=FLASHCARD_JOB_DEFINITION,
        credential=Credential('platform_key', api_key),
        model='fake-model',
        prompt_version=prompt_version,
    )


def context(seconds=5.0):
    return CallContext(deadline=time.monotonic() + seconds)


# ---------------------------------------------------------------- success
def test_a_streamed_json_answer_becomes_the_output_with_the_reported_usage(fake, provider):
    fake.script(json_reply(CARDS, chunks=7))
    result = provider.generate(request(), context())
    assert result.output == CARDS
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 7)
    assert result.model == 'fake-model'


def test_the_call_streams_json_mode_with_the_key_and_the_rendered_prompt(fake, provider):
    fake.script(json_reply(CARDS))
    provider.generate(request(), context())
    sent = fake.requests[0]
    assert sent['stream'] is True and sent['stream_options'] == {'include_usage': True}
    assert sent['response_format'] == {'type': 'json_object'}
    assert sent['model'] == 'fake-model'
    assert sent['_headers']['authorization'] == 'Bearer ' + API_KEY
    assert 'Paris is the capital of France.' in sent['messages'][-1]['content']
    assert 'at most 3 flashcards' in sent['messages'][-1]['content']
    assert '"cards"' in sent['messages'][0]['content']  # the output schema is in the prompt


def test_without_reported_usage_the_tokens_are_estimated(fake, provider):
    fake.script(json_reply(CARDS, usage=None))
    usage = provider.generate(request(), context()).usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_a_json_answer_in_a_markdown_fence_is_accepted(fake, provider):
    fake.script(Reply(content='```json\n%s\n```' % json.dumps(CARDS)))
    assert provider.generate(request(), context()).output == CARDS


# ---------------------------------------------------------------- failure classes (contracts §5.2)
FAILURES = [
    (
        error_reply(429, 'slow down', headers={'Retry-After': '7'}),
        ProviderError,
        'PROVIDER_RATE_LIMITED',
        True,
    ),
    (error_reply(500, 'boom'), ProviderError, 'PROVIDER_ERROR', True),
    (error_reply(503, 'overloaded'), ProviderError, 'PROVIDER_UNAVAILABLE', True),
    (error_reply(401, 'bad key'), CredentialError, 'CREDENTIAL_INVALID', False),
    (error_reply(403, 'forbidden'), CredentialError, 'CREDENTIAL_INVALID', False),
    (
        error_reply(
            400,
            "This model's maximum context length is 65536 tokens",
            code='context_length_exceeded',
        ),
        ProviderRequestError,
        'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH',
        False,
    ),
    (error_reply(400, 'unknown parameter'), ProviderRequestError, 'PROVIDER_BAD_REQUEST', False),
    (error_reply(404, 'no such model'), ProviderRequestError, 'PROVIDER_BAD_REQUEST', False),
    (
        Reply(content='', finish_reason='content_filter'),
        ContentSafetyError,
        'CONTENT_SAFETY_BLOCKED',
        False,
    ),
    (
        Reply(content='', refusal='I cannot help with that.'),
        ContentSafetyError,
        'CONTENT_SAFETY_BLOCKED',
        False,
    ),
    (Reply(content='{"cards": [', finish_reason=None), ProviderError, 'PROVIDER_ERROR', True),
    (Reply(content='Here are your cards: none'), OutputValidationError, 'VALIDATION_JSON', True),
    (Reply(content='[1, 2, 3]'), OutputValidationError, 'VALIDATION_JSON', True),
    (
        Reply(content='{"cards": [', finish_reason='length'),
        OutputValidationError,
        'VALIDATION_JSON',
        True,
    ),
]


@pytest.mark.parametrize(
    'reply, error_class, code, retryable',
    FAILURES,
    ids=[f[2] + '-' + str(i) for i, f in enumerate(FAILURES)],
)
def test_each_failure_maps_to_its_class_code_and_retryability(
    fake, provider, reply, error_class, code, retryable
):
    fake.script(reply)
    with pytest.raises(error_class) as caught:
        provider.generate(request(), context())
    assert caught.value.code == code
    assert caught.value.retryable is retryable
    assert len(fake.requests) == 1  # the client never retries: the engine does


def test_rate_limiting_keeps_retry_after_for_the_engine_backoff(fake, provider):
    fake.script(error_reply(429, 'slow down', headers={'Retry-After': '7'}))
    with pytest.raises(ProviderError) as caught:
        provider.generate(request(), context())
    assert caught.value.retry_after_s == 7.0


def test_retry_after_may_be_milliseconds_or_an_http_date():
    assert retry_after_seconds({'retry-after-ms': '1500'}) == 1.5
    later = time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds({'retry-after': later}) <= 31
    assert retry_after_seconds({}) is None


def test_a_failure_after_the_stream_carries_the_usage_it_consumed(fake, provider):
    fake.script(Reply(content='not json'))
    with pytest.raises(OutputValidationError) as caught:
        provider.generate(request(), context())
    assert (caught.value.usage.prompt_tokens, caught.value.usage.completion_tokens) == (11, 7)


def test_a_server_that_refuses_connections_is_unavailable():
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(('127.0.0.1', 0))
        port = probe.getsockname()[1]
    provider = OpenAICompatibleProvider('http://127.0.0.1:%d/v1' % port, 'm')
    with pytest.raises(ProviderError) as caught:
        provider.generate(request(), context())
    assert caught.value.code == 'PROVIDER_UNAVAILABLE' and caught.value.retryable


def test_a_silent_connection_times_out_as_a_retryable_provider_timeout(fake):
    provider = OpenAICompatibleProvider(fake.base_url, 'fake-model', read_timeout_s=0.3)
    fake.script(json_reply(CARDS, first_delay_s=20))
    with pytest.raises(ProviderError) as caught:  # the job's 10 s deadline would be a JobTimeout
        provider.generate(request(), context(seconds=10))
    assert caught.value.code == 'PROVIDER_TIMEOUT' and caught.value.retryable


def test_a_missing_key_fails_before_any_request(fake, provider):
    with pytest.raises(CredentialError) as caught:
        provider.generate(request(api_key=None), context())
    assert caught.value.code == 'CREDENTIAL_MISSING' and not caught.value.retryable
    assert fake.requests == []


# ---------------------------------------------------------------- deadline and cancellation
def test_the_deadline_passing_mid_stream_stops_the_call_and_hangs_up(fake, provider):
    fake.script(json_reply(CARDS, chunks=100, delay_s=0.2))
    with pytest.raises(JobTimeoutError):
        provider.generate(request(), context(seconds=0.7))
    assert fake.client_closed.wait(2)  # mid-stream: not at the end of the 20 s stream


def test_cancelling_a_slow_stream_stops_it_promptly_and_closes_the_connection(fake, provider):
    fake.script(json_reply(CARDS, chunks=40, delay_s=0.2))
    ctx = context(seconds=30)
    threading.Timer(0.5, ctx.cancel_event.set).start()
    with pytest.raises(JobCancelledError):
        provider.generate(request(), ctx)
    assert fake.client_closed.wait(2)  # mid-stream: not at the end of the 8 s stream


def test_cancelling_while_the_server_is_silent_hangs_up_at_once(fake, provider):
    fake.script(json_reply(CARDS, first_delay_s=20))
    ctx = context(seconds=30)
    threading.Timer(0.3, ctx.cancel_event.set).start()
    with pytest.raises(JobCancelledError):
        provider.generate(request(), ctx)
    assert fake.client_closed.wait(2)  # during the 20 s silence, not after it


def test_a_cancel_hangs_up_only_its_own_stream_among_silent_ones(fake, provider):
    # One watcher looks after every open stream: it must hang up the cancelled one only. The
    # 3.5 s silence leaves a loaded machine room to tell "during it" from "after it", and stays
    # under the provider's 5 s read timeout, which the other call must not reach.
    fake.script(json_reply(CARDS, first_delay_s=3.5))
    cancelled, other = context(seconds=30), context(seconds=30)
    outcomes = {}

    def call(name, ctx):
        started = time.monotonic()
        try:
            outcomes[name] = provider.generate(request(), ctx).output
        except JobCancelledError:
            outcomes[name] = time.monotonic() - started

    threads = [threading.Thread(target=call, args=a) for a in (('a', cancelled), ('b', other))]
    for thread in threads:
        thread.start()
    threading.Timer(0.3, cancelled.cancel_event.set).start()
    for thread in threads:
        thread.join(15)
    assert outcomes['a'] < 2.5  # cancelled at 0.3 s, hung up during the 3.5 s silence
    assert outcomes['b'] == CARDS


def test_the_stream_watcher_runs_only_while_a_stream_is_open(fake, provider):
    fake.script(json_reply(CARDS))
    provider.generate(request(), context())
    # It ends at its first look with no stream open: within a few intervals, however loaded
    # the machine (a fixed sleep of four intervals was a race).
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name == 'aijob-stream-watcher'],
        timeout=100 * WATCH_INTERVAL_S,
    )


def test_a_job_cancelled_before_the_call_sends_nothing(fake, provider):
    ctx = context()
    ctx.cancel_event.set()
    with pytest.raises(JobCancelledError):
        provider.generate(request(), ctx)
    assert fake.requests == []


# ---------------------------------------------------------------- prompts
def test_a_retry_reminds_the_model_to_answer_with_json_only(fake, provider):
    fake.script(json_reply(CARDS))
    provider.generate(request(attempt=2), context())
    assert 'JSON object only' in fake.requests[0]['messages'][0]['content']


def test_an_unknown_prompt_version_is_a_request_error_without_a_call(fake, provider):
    with pytest.raises(ProviderRequestError) as caught:
        provider.generate(request(prompt_version='v99'), context())
    assert not caught.value.retryable
    assert fake.requests == []


# ---------------------------------------------------------------- connection pools
def test_calls_lease_the_pool_with_fewest_calls_and_a_new_one_when_all_are_full():
    pools = _HttpPools()
    leased = [pools.lease() for _ in range(2 * CALLS_PER_POOL + 1)]
    assert leased[0][0] is pools.first  # the provider's client's own pool comes first
    assert len({id(pool[0]) for pool in leased}) == 3  # no call waited for a connection
    assert [pool[1] for pool in (leased[0], leased[CALLS_PER_POOL], leased[-1])] == [
        CALLS_PER_POOL,
        CALLS_PER_POOL,
        1,
    ]
    pools.release(leased[0])
    assert pools.lease() is leased[-1]  # 1 call, fewer than the first's 63


# ---------------------------------------------------------------- the protocol, read directly
class Body:
    """A streamed response's body as it arrives, in the pieces given."""

    def __init__(self, *pieces):
        self.pieces = pieces

    def iter_bytes(self):
        return iter(self.pieces)


def test_server_sent_events_are_framed_as_the_protocol_says_however_the_bytes_arrive():
    pieces = (
        b': a comment\r\nevent: chunk\r\nid: 1\r\ndata: {"a"',  # CRLF, split mid-line
        b': 1}\r',  # a CR whose LF comes in the next piece: still one line end
        b'\n\r\ndata: first line\ndata:second line\n\n',  # data lines joined by a newline
        b'data: [DONE]\n\ndata: {"unfinished": true}',  # an event the body never ends
    )
    assert list(openai_client._event_data(Body(*pieces).iter_bytes())) == [
        b'{"a": 1}',
        b'first line\nsecond line',
        b'[DONE]',
    ]


def test_chunks_end_at_done_and_an_error_event_or_bad_data_fails_the_stream():
    good = b'data: {"choices": []}\n\n'
    assert list(openai_client._chunks(Body(good, b'data: [DONE]\n\n', good))) == [{'choices': []}]
    with pytest.raises(openai_client._ErrorEvent, match='overloaded'):
        list(openai_client._chunks(Body(good, b'data: {"error": {"message": "overloaded"}}\n\n')))
    for bad in (b'data: not json\n\n', b'data: [1, 2]\n\n'):
        with pytest.raises(ValueError):
            list(openai_client._chunks(Body(bad)))


@pytest.mark.parametrize(
    'answer, code, message',
    [
        (
            httpx2.Response(
                429, json={'error': {'message': 'slow down'}}, headers={'Retry-After': '7'}
            ),
            'PROVIDER_RATE_LIMITED',
            'slow down',
        ),
        (
            httpx2.Response(
                400,
                json={'error': {'message': 'too long', 'code': 'context_length_exceeded'}},
            ),
            'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH',
            'too long',
        ),
        (
            httpx2.Response(400, json={'message': 'no error object'}),
            'PROVIDER_BAD_REQUEST',
            'no error object',
        ),
        (
            httpx2.Response(502, text='<html>bad gateway</html>'),
            'PROVIDER_UNAVAILABLE',
            'bad gateway',
        ),
        (
            httpx2.Response(500, json={'error': 'a string'}),
            'PROVIDER_ERROR',
            "{'error': 'a string'}",
        ),
    ],
)
def test_an_answer_other_than_2xx_is_read_as_the_openai_package_reads_it(answer, code, message):
    failure = openai_client.answer_failure(answer)
    assert failure.code == code
    assert message in str(failure)
    if code == 'PROVIDER_RATE_LIMITED':
        assert failure.retry_after_s == 7.0


def test_a_stream_read_to_its_end_leaves_its_keep_alive_connection_for_the_next_call():
    """A server that keeps connections alive (chunked bodies, as OpenAI's): the call reads past
    ``[DONE]`` to the body's end, so the next call reuses the connection."""
    events = b''
    for event in (
        {'choices': [{'delta': {'content': json.dumps(CARDS)}, 'finish_reason': 'stop'}]},
        '[DONE]',
    ):
        data = b'data: %s\n\n' % (event if isinstance(event, str) else json.dumps(event)).encode()
        events += b'%x\r\n%s\r\n' % (len(data), data)
    answer = (
        b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n'
        b'Transfer-Encoding: chunked\r\n\r\n' + events + b'0\r\n\r\n'
    )
    server = ScriptedServer([answer] * 3)
    prompts = default_library()
    prompts.add(FLASHCARDS_V1)
    base_url = server.url.rsplit('/chat/completions', 1)[0]
    provider = OpenAICompatibleProvider(base_url, 'm', prompts=prompts)
    try:
        for _ in range(3):
            assert provider.generate(request(), context()).output == CARDS
        assert server.connections == 1
    finally:
        server.close()


def test_where_a_proxy_applies_the_call_goes_through_httpx_and_reads_the_same(
    fake, provider, monkeypatch
):
    monkeypatch.setenv('ALL_PROXY', 'http://proxy.internal:3128')
    monkeypatch.delenv('NO_PROXY', raising=False)
    monkeypatch.delenv('no_proxy', raising=False)
    proxied = OpenAICompatibleProvider(fake.base_url, 'fake-model', prompts=provider.prompts)
    assert proxied._endpoint is None  # httpx, which reads the same variables, takes the call
    # No proxy here to go through: the httpx path is run against the fake directly.
    provider._endpoint = None
    fake.script(
        json_reply(CARDS, chunks=5), error_reply(429, 'slow down', headers={'Retry-After': '7'})
    )
    assert provider.generate(request(), context()).output == CARDS
    with pytest.raises(ProviderError) as caught:
        provider.generate(request(), context())
    assert (caught.value.code, caught.value.retry_after_s) == ('PROVIDER_RATE_LIMITED', 7.0)
