"""The OpenAI-compatible provider: one chat-completions client for DeepSeek, OpenAI, vLLM, Ollama
and llama.cpp servers. It streams, so that a cancelled job or a passed deadline stops the upstream
request between chunks, and it only classifies failures (contracts §5.2): the engine owns retries.
The chat call speaks the protocol itself (``_open``), over http_stream.py (httpx where a proxy
applies); the ``openai`` package lists models. Every exception of these is translated here; none
leaves this module."""

import email.utils
import json
import socket
import threading
import time

import httpx2  # the openai package's HTTP client
import openai

from ...core.errors import (
    ContentSafetyError,
    CredentialError,
    JobCancelledError,
    JobTimeoutError,
    OutputValidationError,
    ProviderError,
    ProviderRequestError,
)
from ...execution.prompts import default_library
from ...execution.providers import Provider, ProviderResult, Usage
from . import http_stream
from .context_errors import context_length_sign

WATCH_INTERVAL_S = 0.05  # how soon a cancel or deadline interrupts a stalled read
CHARS_PER_TOKEN = 4  # the usual estimate when a server reports no usage
# The most tokens a chat template adds around each message (its special tokens and separators,
# besides the role's name, which is counted by its bytes) and once per request (the start of
# the text, the reply's opening, a default system preamble such as Qwen's or Llama 3.1's).
TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_PER_REQUEST = 128


USER_AGENT = 'aijob'  # the chat call's User-Agent (``_open``)

# The calls one HTTP connection pool holds at most (``_HttpPools``), and the idle connections it
# keeps for its next calls.
CALLS_PER_POOL = 64
KEEPALIVE_CONNECTIONS = CALLS_PER_POOL


def _http_client(ssl_context):
    # No cap on connections: the package's default (1 000) would make the calls beyond it wait
    # for a connection until they time out; the worker's slots and the gateway's rate limits
    # bound how many calls run.
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS)
    return openai.DefaultHttpxClient(limits=limits, verify=ssl_context)


class _HttpPools:
    """A provider's HTTP clients, each with its own connection pool: a call leases the one with
    the fewest calls, and a new one is made when each holds CALLS_PER_POOL. *Why:* the HTTP
    pool scans all its connections and requests whenever a request starts or ends, so one
    pool holding thousands of streams cost O(N²) (a tenth of a worker's CPU at 2 000 calls,
    issue 34); a pool here holds at most CALLS_PER_POOL calls. A call never waits: there is
    always a pool with room, a new one if need be. Pools are kept for the process: an idle
    pool holds at most KEEPALIVE_CONNECTIONS idle connections, which httpx closes once they
    have been idle for its keep-alive expiry (5 s), at that pool's next request."""

    def __init__(self):
        # The TLS settings an httpx client makes by default (verify=True, SSL_CERT_FILE and
        # SSL_CERT_DIR honoured), made once for all the pools: each client would load the CA
        # certificates again (~25 ms of CPU).
        self.ssl_context = httpx2.create_ssl_context()
        self._lock = threading.Lock()
        self.first = _http_client(self.ssl_context)
        self._pools = [[self.first, 0]]  # [httpx client, calls it holds]

    def lease(self):
        """[httpx client, calls it holds] for one call, to ``release`` when it ends."""
        with self._lock:
            pool = min(self._pools, key=_calls_held)
            if pool[1] >= CALLS_PER_POOL:
                pool = [_http_client(self.ssl_context), 0]
                self._pools.append(pool)
            pool[1] += 1
        return pool

    def release(self, pool):
        with self._lock:
            pool[1] -= 1


def _calls_held(pool):
    return pool[1]


class OpenAICompatibleProvider(Provider):
    needs_api_key = True

    def __init__(
        self, base_url, model, prompts=None, key='openai', read_timeout_s=60.0, needs_api_key=True
    ):
        self.key = key
        self.needs_api_key = needs_api_key  # False: a local server (llama.cpp) that takes none
        self.model = model
        self.base_url = base_url
        self.read_timeout_s = read_timeout_s
        self.prompts = prompts or default_library()
        # The chat call goes through the provider's own transport (http_stream.py), or, where
        # a proxy applies, leases an httpx client of the provider's pools (``_HttpPools``);
        # each call sets its own key and timeout. The package's client (on the pools' first
        # httpx client) serves only ``list_models``; max_retries=0: a retry there would hide
        # failures from the engine's retry policy.
        self._pools = _HttpPools()
        self._chat_url = base_url.rstrip('/') + '/chat/completions'
        self._endpoint = None
        if not http_stream.proxy_applies(self._chat_url):
            self._endpoint = http_stream.Endpoint(self._chat_url, self._pools.ssl_context)
        self._client = openai.OpenAI(
            api_key='unset', base_url=base_url, max_retries=0, http_client=self._pools.first
        )

    def generate(self, request, ctx):
        if not request.credential.api_key and self.needs_api_key:
            raise CredentialError('no API key for %s' % self.key, code='CREDENTIAL_MISSING')
        messages = self.prompts.render(request)
        ctx.check()
        call = _Call(ctx, estimate_tokens(messages))
        model = request.model or self.model
        try:
            if self._endpoint is not None:
                return call.collect(self._open(request, messages, ctx), model)
            pool = self._pools.lease()
            try:
                return call.collect(self._open(request, messages, ctx, pool[0]), model)
            finally:
                self._pools.release(pool)
        except (httpx2.HTTPError, http_stream.TransportError, _Answered, _ErrorEvent) as exc:
            raise call.translate(exc) from None
        except ValueError:
            # A stream event whose data is not JSON: the server broke the protocol.
            raise call.translate_malformed() from None

    def _open(self, request, messages, ctx, http_client=None):
        """The streamed response of one chat completion, its status checked: an answer other
        than 2xx raises _Answered, its body read (``answer_failure`` classes it). It goes
        through the provider's own transport (http_stream.py), or through ``http_client``
        (httpx) when a proxy applies. *Why not the package's ``chat.completions.create``:* it
        builds, copies and validates a request's options and wraps the response in layers of
        its own, about 1 ms of CPU per call and a third of the reading of each chunk, which
        bound how many streamed calls a worker holds (issue 34); the request and the events
        are the protocol's, as its public reference documents them."""
        # The job's deadline bounds the whole call; a silent connection fails sooner, as a
        # retryable PROVIDER_TIMEOUT, while the job still has time for another attempt.
        remaining = max(0.001, ctx.remaining_s())
        read_timeout_s = min(remaining, self.read_timeout_s)
        api_key = request.credential.api_key or 'unset'  # a keyless local server ignores it
        body = self.chat_body(request, messages)
        body['stream'] = True
        body['stream_options'] = {'include_usage': True}
        headers = {
            'Authorization': 'Bearer %s' % api_key,
            'Content-Type': 'application/json',
            'Accept': 'text/event-stream',
            'User-Agent': USER_AGENT,
        }
        content = json.dumps(body).encode()
        if http_client is None:
            response = self._endpoint.post(headers, content, remaining, read_timeout_s)
        else:
            timeout = httpx2.Timeout(remaining, read=read_timeout_s)
            sent = http_client.build_request(
                'POST', self._chat_url, headers=headers, content=content, timeout=timeout
            )
            response = http_client.send(sent, stream=True)
        if response.is_success:
            return response
        try:
            response.read()
        finally:
            response.close()
        raise _Answered(response)

    def chat_body(self, request, messages=None):
        """The chat completion body of ``request`` as this provider sends it, streaming left
        out: the online call and a provider batch's line (engine/features/batches/) send the
        same request. ``messages``: already rendered (default: rendered here)."""
        if messages is None:
            messages = self.prompts.render(request)
        body = {
            'model': request.model or self.model,
            'messages': messages,
            'response_format': {'type': 'json_object'},
        }
        if request.max_tokens:
            body['max_tokens'] = request.max_tokens
        return body

    def list_models(self, api_key, timeout_s=10.0):
        """The model ids ``GET /models`` answers (``python aijob.py providers --check``);
        raises the JobFailure ``classify`` gives a failure."""
        client = self._client.with_options(api_key=api_key or 'unset', timeout=timeout_s)
        try:
            return [model.id for model in client.models.list()]
        except openai.OpenAIError as exc:
            raise classify(exc) from None


class _Call:
    """One streamed completion: its accumulated text, usage, and failure translation."""

    def __init__(self, ctx, prompt_tokens):
        self.ctx = ctx
        self.prompt_tokens = prompt_tokens
        self.parts = []
        self.refusal = []
        self.finish_reason = None
        self.usage = None
        self.model = None

    def collect(self, response, model):
        _WATCHER.watch(self.ctx, response)
        try:
            for chunk in _chunks(response):
                self.ctx.check()  # cancelled or out of time: leave; ``finally`` hangs up
                self._take(chunk)
            self.ctx.check()  # the watcher's hang-up can look like a normal end
        except (JobCancelledError, JobTimeoutError) as exc:
            exc.usage = self.estimated_usage()
            raise
        finally:
            _WATCHER.forget(response)
            response.close()
        return self._result(model)

    def _take(self, chunk):
        """One chunk, as the JSON object the server sent (``_chunks``)."""
        self.model = chunk.get('model') or self.model
        usage = chunk.get('usage')
        if isinstance(usage, dict):
            self.usage = Usage(
                usage.get('prompt_tokens') or 0,
                usage.get('completion_tokens') or 0,
                cached_prompt_tokens=_cached_tokens(usage),
            )
        for choice in chunk.get('choices') or ():
            if not isinstance(choice, dict):
                raise ValueError('a choice that is not a JSON object')  # a malformed event
            delta = choice.get('delta') or {}
            if not isinstance(delta, dict):
                raise ValueError('a delta that is not a JSON object')
            content = delta.get('content')
            if content:
                self.parts.append(content)
                self.ctx.report_text(content)  # to the job's live stream, if followed
            if delta.get('refusal'):
                self.refusal.append(delta['refusal'])
            if choice.get('finish_reason'):
                self.finish_reason = choice['finish_reason']

    def _result(self, model):
        usage = self.usage or self.estimated_usage()
        if self.finish_reason is None:
            raise _with_usage(
                ProviderError(
                    'the stream ended before the completion finished', code='PROVIDER_ERROR'
                ),
                usage,
            )
        if self.finish_reason == 'content_filter' or self.refusal:
            raise _with_usage(
                ContentSafetyError(
                    'provider refused: finish_reason=%s' % self.finish_reason,
                    public_message='The AI provider refused the content.',
                ),
                usage,
            )
        output = parse_json_object(''.join(self.parts), self.finish_reason)
        if isinstance(output, OutputValidationError):
            raise _with_usage(output, usage)
        return ProviderResult(output=output, usage=usage, model=self.model or model)

    def estimated_usage(self):
        completion = sum(len(part) for part in self.parts) // CHARS_PER_TOKEN
        return self.usage or Usage(self.prompt_tokens, completion)

    def translate(self, exc):
        """The JobFailure for a failed call (``classify``), with what the call consumed."""
        if self.ctx.is_cancelled():
            failure = JobCancelledError('cancel requested during the provider call')
        elif self.ctx.remaining_s() <= 0:
            failure = JobTimeoutError('deadline passed during the provider call')
        else:
            failure = classify(exc)
        # A failure before any chunk was billed nothing we can know of; after, estimate.
        return _with_usage(failure, self.estimated_usage() if self.parts or self.usage else Usage())

    def translate_malformed(self):
        if self.ctx.is_cancelled() or self.ctx.remaining_s() <= 0:
            return self.translate(None)  # what a hang-up left half-read is no server's fault
        return _with_usage(
            ProviderError('provider sent a malformed stream event', code='PROVIDER_ERROR'),
            self.estimated_usage(),
        )


class _Answered(Exception):  # noqa: N818 - not an error of ours: the provider's answer
    """The provider answered with a status other than 2xx; its body is read."""

    def __init__(self, response):
        super().__init__(response.status_code)
        self.response = response


class _ErrorEvent(Exception):  # noqa: N818
    """The stream sent an event whose JSON object holds an ``error``."""


def _chunks(response):
    """The stream's chunks as the JSON objects the server sent: ``[DONE]`` ends the stream, an
    event holding an ``error`` raises _ErrorEvent, data that is no JSON object ValueError."""
    events = _event_data(response.iter_bytes())
    for data in events:
        if data.startswith(b'[DONE]'):
            for _ in events:  # read to the body's end (as the package does), so that a
                pass  # keep-alive connection goes back to its pool for the next call
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError('a stream event that is not a JSON object')
        if chunk.get('error'):
            error = chunk['error']
            message = error.get('message') if isinstance(error, dict) else None
            raise _ErrorEvent(message if isinstance(message, str) and message else 'no message')
        yield chunk


def _event_data(pieces):
    """The data of each server-sent event (bytes; several ``data:`` lines joined by newlines)
    read from ``pieces``, the body's bytes as they arrive. Lines end with LF, CRLF or CR; an
    empty line ends an event; other fields (``event``, ``id``, ``retry``) and comments carry
    nothing a chunk needs; an event the body leaves unfinished is dropped, as the protocol
    says."""
    pending, data = b'', []
    for piece in pieces:
        lines = (pending + piece).splitlines(True)
        # The last line waits for its end (a CR may be the first half of a CRLF).
        pending = lines.pop() if lines and not lines[-1].endswith(b'\n') else b''
        if len(pending) > http_stream.EVENT_LIMIT:
            raise ValueError('an event line without end')  # a malformed stream
        for line in lines:
            line = line.rstrip(b'\r\n')
            if not line:
                if data:
                    yield b'\n'.join(data)
                    data = []
            elif line.startswith(b'data:'):
                value = line[5:]
                data.append(value[1:] if value.startswith(b' ') else value)


class _Watcher:
    """Hangs up the socket of each open stream whose job is cancelled or out of time, so a read
    blocked on a silent server returns at once (closing the response alone does not wake it).
    One thread for all the process's streams, which looks at each every WATCH_INTERVAL_S: a
    thread per stream, each waking 20 times a second, made 40 000 wake-ups a second with 2 000
    streams open (issue 34). It runs while a stream is open and ends when none is."""

    def __init__(self):
        self._lock = threading.Lock()
        self._streams = {}  # id(stream): (ctx, stream)
        self._running = False

    def watch(self, ctx, stream):
        with self._lock:
            self._streams[id(stream)] = (ctx, stream)
            start, self._running = not self._running, True
        if start:  # outside the lock: a thread's start waits for it to run
            threading.Thread(target=self._run, daemon=True, name='aijob-stream-watcher').start()

    def forget(self, stream):
        # Under the lock: once this returns, the watcher cannot hang up this stream's socket,
        # which its connection may lend to another call once the stream is closed.
        with self._lock:
            self._streams.pop(id(stream), None)

    def _run(self):
        try:
            while True:
                time.sleep(WATCH_INTERVAL_S)
                with self._lock:
                    if not self._streams:
                        self._running = False  # under the lock: a stream watched next starts one
                        return
                    for key, (ctx, stream) in list(self._streams.items()):
                        if ctx.is_cancelled() or ctx.remaining_s() <= 0:
                            del self._streams[key]
                            _hang_up(stream)
        except BaseException:
            with self._lock:
                self._running = False  # not expected; the next stream watched starts another
            raise


_WATCHER = _Watcher()


def _hang_up(response):
    if isinstance(response, http_stream.Response):
        response.hang_up()
        return
    network = response.extensions.get('network_stream')  # httpx's
    sock = network.get_extra_info('socket') if network is not None else None
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the other side


def answer_failure(response):
    """The JobFailure of an answer other than 2xx (its body read), read as the ``openai``
    package reads one: the body's ``error`` object (or the body itself) gives the message, the
    code and the type."""
    try:
        data = json.loads(response.content)
    except ValueError:
        data = None
    body = data.get('error', data) if isinstance(data, dict) else None
    body = body if isinstance(body, dict) else {}
    message = body.get('message')
    if not isinstance(message, str) or not message:
        shown = data if data is not None else response.text[:300]
        message = 'Error code: %d - %s' % (response.status_code, shown)
    return status_failure(
        response.status_code,
        message,
        body.get('code'),
        retry_after_seconds(response.headers),
        error_type=body.get('type'),
    )


# The timeouts and the connection failures of the three ways a call goes: the chat call's own
# transport, httpx (where a proxy applies), the ``openai`` package (``list_models``). A timeout
# is also a connection failure to each of them: it is looked for first.
_TIMEOUTS = (http_stream.Timeout, httpx2.TimeoutException, openai.APITimeoutError)
_CONNECTION_FAILURES = (
    http_stream.TransportError,
    httpx2.TransportError,
    openai.APIConnectionError,
)


def classify(exc):
    """contracts §5.2 class of a failed call (no deadline or cancellation involved): an answer
    other than 2xx, an error event in the stream, a transport's or the package's exception."""
    if isinstance(exc, _Answered):
        return answer_failure(exc.response)
    if isinstance(exc, _ErrorEvent):
        return ProviderError(
            'provider sent an error event: %s' % str(exc)[:300], code='PROVIDER_ERROR'
        )
    if isinstance(exc, _TIMEOUTS):
        return ProviderError('provider timed out', code='PROVIDER_TIMEOUT')
    if isinstance(exc, _CONNECTION_FAILURES):
        return ProviderError('provider connection failed', code='PROVIDER_UNAVAILABLE')
    if isinstance(exc, openai.APIStatusError):
        return _classify_status(exc)
    return ProviderError('provider error: %s' % exc.__class__.__name__, code='PROVIDER_ERROR')


def _classify_status(exc):
    retry_after_s = retry_after_seconds(exc.response.headers)
    return status_failure(
        exc.status_code, _error_message(exc), exc.code, retry_after_s, error_type=exc.type
    )


def status_failure(status, message, code=None, retry_after_s=None, error_type=None):
    """contracts §5.2 class of an HTTP ``status`` the provider answered, with its error body's
    ``message``, ``code`` and ``type``: the online call's failure, and a provider batch's failed
    line's."""
    detail = 'provider answered HTTP %d: %s' % (status, message[:300])
    if status == 429:
        return ProviderError(detail, code='PROVIDER_RATE_LIMITED', retry_after_s=retry_after_s)
    if status in (401, 403):
        return CredentialError(detail, code='CREDENTIAL_INVALID')
    if status == 408:
        return ProviderError(detail, code='PROVIDER_TIMEOUT')
    if status in (502, 503, 504):
        return ProviderError(detail, code='PROVIDER_UNAVAILABLE', retry_after_s=retry_after_s)
    if status >= 500:
        return ProviderError(detail, code='PROVIDER_ERROR')
    if context_length_sign(code, error_type, message):
        return ProviderRequestError(
            detail,
            code='PROVIDER_BAD_REQUEST_CONTEXT_LENGTH',
            public_message='The input is too long for the AI model.',
        )
    return ProviderRequestError(detail, code='PROVIDER_BAD_REQUEST')


def _error_message(exc):
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get('message') if isinstance(body.get('message'), str) else exc.message
    return message or ''


def parse_completion(body, model=''):
    """The ProviderResult of a chat.completion object (a provider batch's answered line),
    judged as the streamed call judges its end: a refusal or a content filter is a
    ContentSafetyError, output that is no JSON object an OutputValidationError, each carrying
    the usage."""
    usage = completion_usage(body.get('usage') or {})
    choices = body.get('choices') or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get('message') or {}
    finish_reason = choice.get('finish_reason')
    if finish_reason == 'content_filter' or message.get('refusal'):
        raise _with_usage(
            ContentSafetyError(
                'provider refused: finish_reason=%s' % finish_reason,
                public_message='The AI provider refused the content.',
            ),
            usage,
        )
    output = parse_json_object(message.get('content') or '', finish_reason)
    if isinstance(output, OutputValidationError):
        raise _with_usage(output, usage)
    return ProviderResult(output=output, usage=usage, model=body.get('model') or model)


def completion_usage(raw):
    """The Usage of a chat completion's ``usage`` object (a dict): cached prompt tokens from
    OpenAI's ``prompt_tokens_details`` or DeepSeek's ``prompt_cache_hit_tokens``."""
    details = raw.get('prompt_tokens_details') or {}
    cached = details.get('cached_tokens')
    if cached is None:
        cached = raw.get('prompt_cache_hit_tokens')
    return Usage(
        raw.get('prompt_tokens') or 0,
        raw.get('completion_tokens') or 0,
        cached_prompt_tokens=cached if isinstance(cached, int) and cached > 0 else 0,
    )


def retry_after_seconds(headers):
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get('retry-after-ms')
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get('retry-after')
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_json_object(text, finish_reason=None):
    """The output dict, or an OutputValidationError (returned, for the caller to attach usage).
    Markdown code fences, which some local models add despite JSON mode, are tolerated."""
    body = text.strip()
    if body.startswith('```'):
        body = body.split('\n', 1)[1] if '\n' in body else ''
        body = body.rsplit('```', 1)[0].strip()
    try:
        value = json.loads(body)
    except ValueError:
        truncated = ' (cut off: finish_reason=length)' if finish_reason == 'length' else ''
        return OutputValidationError(
            'provider output is not JSON%s' % truncated, code='VALIDATION_JSON'
        )
    if not isinstance(value, dict):
        return OutputValidationError(
            'provider output is JSON but not an object', code='VALIDATION_JSON'
        )
    return value


def _cached_tokens(usage):
    """Prompt tokens served from the provider's cache: OpenAI's ``prompt_tokens_details``, or
    DeepSeek's ``prompt_cache_hit_tokens``; 0 when the server says nothing."""
    details = usage.get('prompt_tokens_details')
    cached = details.get('cached_tokens') if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get('prompt_cache_hit_tokens')
    return cached if isinstance(cached, int) and cached > 0 else 0


def estimate_tokens(messages):
    return sum(len(message['content']) for message in messages) // CHARS_PER_TOKEN


def prompt_token_bound(messages):
    """The most prompt tokens ``messages`` can count as, whatever the tokenizer, as long as it
    is byte-level BPE (GPT, Llama 3, Qwen, DeepSeek) or SentencePiece with byte fallback: each
    token of the text stands for at least one of its UTF-8 bytes, so the text counts at most
    its byte length; the template adds the allowances above. It is about 4 times what a
    tokenizer counts for English and 3 to 5 times for Chinese: the headroom budgets pay for
    never under-reserving."""
    total = TEMPLATE_TOKENS_PER_REQUEST
    for message in messages:
        text = message['role'] + message['content']  # the templates render text only
        total += len(text.encode('utf-8')) + TEMPLATE_TOKENS_PER_MESSAGE
    return total


def prompt_measures(provider, request):
    """(estimate, bound) of the prompt ``provider`` would send for ``request``, from one
    rendering: the estimate at 4 characters a token (what rate limits reserve, as providers'
    own limits count) and ``prompt_token_bound`` (what budgets reserve). (0, None) for a
    provider without templates, or a prompt that cannot render (the call itself then reports
    it)."""
    prompts = getattr(provider, 'prompts', None)
    if prompts is None:
        return 0, None
    try:
        messages = prompts.render(request)
    except Exception:  # noqa: BLE001 - reported by the call, not by its measures
        return 0, None
    return estimate_tokens(messages), prompt_token_bound(messages)


def _with_usage(failure, usage):
    failure.usage = usage
    return failure
