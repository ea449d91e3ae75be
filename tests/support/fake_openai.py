"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions protocol (SSE streaming
included), scripted per test: each request takes the next scripted Reply (the last one repeats).
It records every request and whether the client closed a streaming connection early. It also
answers ``GET /v1/models`` (the model list, or the scripted ``models_status``), and can be
started again on the port it had (a provider that went down and came back)."""

import json
import math
import select
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

import pytest


@dataclass
class Reply:
    """One scripted answer. ``status`` != 200 sends ``error_body`` as JSON with ``headers``;
    otherwise ``content`` is streamed in ``chunks`` pieces, ``delay_s`` apart, after
    ``first_delay_s`` (which delays an error answer too); ``finish_reason`` None ends the
    stream without one (a broken upstream).

    ``prompt_tokens``: a function of the request's messages giving the prompt tokens the usage
    reports (a provider's own tokenizer). ``completion_tokens``: the reply is that many tokens,
    ``content`` the first and a space each of the others, and, as OpenAI does, the request's
    ``max_tokens`` cuts it (``finish_reason`` "length"); the usage reports the tokens written."""

    status: int = 200
    content: str = ''
    chunks: int = 1
    delay_s: float = 0.0
    first_delay_s: float = 0.0
    finish_reason: Optional[str] = 'stop'
    refusal: Optional[str] = None
    usage: Optional[dict] = field(
        default_factory=lambda: {'prompt_tokens': 11, 'completion_tokens': 7}
    )
    headers: dict = field(default_factory=dict)
    error_body: Optional[dict] = None
    prompt_tokens: Optional[Callable] = None
    completion_tokens: Optional[int] = None

    def for_request(self, body):
        """This reply as it answers ``body``: its counted prompt, its tokens cut at the
        request's ``max_tokens``."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return self
        usage = dict(self.usage or {})
        if self.prompt_tokens is not None:
            usage['prompt_tokens'] = self.prompt_tokens(body.get('messages') or [])
        if self.completion_tokens is None:
            return replace(self, usage=usage)
        written = min(self.completion_tokens, body.get('max_tokens') or self.completion_tokens)
        usage['completion_tokens'] = written
        return replace(
            self,
            content=self.content + ' ' * (written - 1),
            finish_reason='length' if written < self.completion_tokens else self.finish_reason,
            usage=usage,
        )


def json_reply(obj, **kw):
    return Reply(content=json.dumps(obj), **kw)


def error_reply(status, message='error', code=None, **kw):
    body = {'error': {'message': message, 'type': 'invalid_request_error', 'code': code}}
    return Reply(status=status, error_body=body, **kw)


class FakeOpenAI:
    def __init__(self, port=0, models=('fake-model',)):
        # Decoded JSON bodies, with '_headers' (and '_text_started': when a stream's first
        # piece of text was written, by time.monotonic()).
        self.requests = []
        self.client_closed = threading.Event()  # a client hung up mid-stream
        self.models = list(models)  # what GET /models lists
        self.models_status = 200  # another status: GET /models answers that error
        self.model_requests = []  # the headers of each GET /models
        self._replies = [json_reply({'ok': True})]
        self._lock = threading.Lock()
        # The rate-limit mode (limit_rate): the arrival times of the requests it answered.
        self._limit = None
        self.answered_at = []
        self.over_limit = 0  # requests that came beyond the limit (each answered 429)
        self._bind(port)

    def _bind(self, port):
        self._server = ThreadingHTTPServer(('127.0.0.1', port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    @property
    def port(self):
        return self._server.server_address[1]

    @property
    def base_url(self):
        return 'http://127.0.0.1:%d/v1' % self.port

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def restart(self):
        """Listen again on the same port after ``stop``: the provider is back."""
        self._bind(self.port)
        return self.start()

    def script(self, *replies):
        with self._lock:
            self._replies = list(replies)

    def limit_rate(self, requests, window_s):
        """Answer at most ``requests`` requests within any ``window_s`` (a sliding window over
        arrivals, as OpenAI's per-minute limits); one beyond it gets 429 with ``Retry-After``
        and is counted in ``over_limit``."""
        with self._lock:
            self._limit = (requests, window_s)

    def admit(self):
        """None when this request is within the limit (it is counted), else the seconds until
        the window has room."""
        with self._lock:
            now = time.monotonic()
            if self._limit is None:
                self.answered_at.append(now)
                return None
            requests, window_s = self._limit
            recent = [t for t in self.answered_at[-requests:] if t > now - window_s]
            if len(recent) >= requests:
                self.over_limit += 1
                return recent[0] + window_s - now
            self.answered_at.append(now)
            return None

    def next_reply(self, body):
        with self._lock:
            self.requests.append(body)
            return self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]


def _handler_for(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def log_message(self, *args):  # keep test output quiet
            pass

        def do_GET(self):
            if self.path.rstrip('/') != '/v1/models':
                return self._send_json(404, {'error': {'message': 'not found'}}, {})
            fake.model_requests.append({k.lower(): v for k, v in self.headers.items()})
            if fake.models_status != 200:
                body = {'error': {'message': 'refused', 'type': 'invalid_request_error'}}
                return self._send_json(fake.models_status, body, {})
            data = [
                {'id': m, 'object': 'model', 'created': 0, 'owned_by': 'fake'} for m in fake.models
            ]
            self._send_json(200, {'object': 'list', 'data': data}, {})

        def do_POST(self):
            length = int(self.headers.get('Content-Length') or 0)
            body = json.loads(self.rfile.read(length) or b'{}')
            body['_headers'] = {name.lower(): value for name, value in self.headers.items()}
            wait_s = fake.admit()
            if wait_s is not None:
                return self._send_json(429, _RATE_LIMITED, {'Retry-After': str(math.ceil(wait_s))})
            reply = fake.next_reply(body).for_request(body)
            if reply.status != 200:
                time.sleep(reply.first_delay_s)  # a slow error: the server thought first
                return self._send_json(reply.status, reply.error_body or {}, reply.headers)
            if not body.get('stream'):
                return self._send_json(200, _completion(body, reply), reply.headers)
            self._stream(body, reply)

        def _send_json(self, status, obj, headers):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, body, reply):
            self.send_response(200)
            self.send_header('Content-Type', 'text/event-stream')
            self.send_header('Connection', 'close')
            self.end_headers()
            self.close_connection = True
            try:
                for number, (delay, event) in enumerate(_events(body, reply)):
                    if delay and self._client_gone_within(delay):
                        fake.client_closed.set()
                        return
                    self.wfile.write(b'data: ' + event.encode() + b'\n\n')
                    self.wfile.flush()
                    if number == 1:  # the first piece of text (the role chunk comes first)
                        body['_text_started'] = time.monotonic()
            except (BrokenPipeError, ConnectionResetError):
                fake.client_closed.set()

        def _client_gone_within(self, seconds):
            """Wait ``seconds``; True as soon as the client closes its end."""
            deadline = time.monotonic() + seconds
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                readable, _, _ = select.select([self.connection], [], [], left)
                if readable:
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return True
                    except (ConnectionResetError, OSError):
                        return True
                    time.sleep(min(left, 0.01))

    return Handler


def _events(body, reply):
    """(delay before, SSE data) pairs for one streamed completion."""
    model = body.get('model', 'fake-model')
    pieces = _split(reply.content, max(1, reply.chunks))
    events = [(reply.first_delay_s, _chunk(model, {'role': 'assistant', 'content': ''}, None))]
    for i, piece in enumerate(pieces):
        events.append((reply.delay_s if i else 0.0, _chunk(model, {'content': piece}, None)))
    if reply.refusal is not None:
        events.append((0.0, _chunk(model, {'refusal': reply.refusal}, None)))
    if reply.finish_reason is None:
        return events  # the upstream broke off: no finish, no [DONE]
    events.append((0.0, _chunk(model, {}, reply.finish_reason)))
    if reply.usage is not None and (body.get('stream_options') or {}).get('include_usage'):
        usage = dict(reply.usage, total_tokens=sum(reply.usage.values()))
        events.append(
            (
                0.0,
                json.dumps(
                    {
                        'id': 'chatcmpl-fake',
                        'object': 'chat.completion.chunk',
                        'created': 0,
                        'model': model,
                        'choices': [],
                        'usage': usage,
                    }
                ),
            )
        )
    events.append((0.0, '[DONE]'))
    return events


# OpenAI's body of a 429 for a request-rate limit.
_RATE_LIMITED = {
    'error': {
        'message': 'Rate limit reached for requests per min (RPM). Please try again later.',
        'type': 'requests',
        'param': None,
        'code': 'rate_limit_exceeded',
    }
}


def _chunk(model, delta, finish_reason):
    return json.dumps(
        {
            'id': 'chatcmpl-fake',
            'object': 'chat.completion.chunk',
            'created': 0,
            'model': model,
            'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish_reason}],
        }
    )


def _completion(body, reply):
    return {
        'id': 'chatcmpl-fake',
        'object': 'chat.completion',
        'created': 0,
        'model': body.get('model', 'fake-model'),
        'choices': [
            {
                'index': 0,
                'finish_reason': reply.finish_reason,
                'message': {
                    'role': 'assistant',
                    'content': reply.content,
                    'refusal': reply.refusal,
                },
            }
        ],
        'usage': reply.usage,
    }


def _split(text, count):
    size = max(1, -(-len(text) // count))
    return [text[i : i + size] for i in range(0, len(text), size)] or ['']


@pytest.fixture
def fake():
    """A FakeOpenAI server on loopback for one test."""
    server = FakeOpenAI().start()
    yield server
    server.stop()
