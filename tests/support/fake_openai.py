"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions protocol (SSE streaming
included), scripted per test: each request takes the next scripted Reply (the last one repeats).
It records every request and whether the client closed a streaming connection early."""

import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import pytest


@dataclass
class Reply:
    """One scripted answer. ``status`` != 200 sends ``error_body`` as JSON with ``headers``;
    otherwise ``content`` is streamed in ``chunks`` pieces, ``delay_s`` apart, after
    ``first_delay_s``; ``finish_reason`` None ends the stream without one (a broken upstream)."""

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


def json_reply(obj, **kw):
    return Reply(content=json.dumps(obj), **kw)


def error_reply(status, message='error', code=None, **kw):
    body = {'error': {'message': message, 'type': 'invalid_request_error', 'code': code}}
    return Reply(status=status, error_body=body, **kw)


class FakeOpenAI:
    def __init__(self):
        # Decoded JSON bodies, with '_headers' (and '_text_started': when a stream's first
        # piece of text was written, by time.monotonic()).
        self.requests = []
        self.client_closed = threading.Event()  # a client hung up mid-stream
        self._replies = [json_reply({'ok': True})]
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(('127.0.0.1', 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    @property
    def base_url(self):
        return 'http://127.0.0.1:%d/v1' % self._server.server_address[1]

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def script(self, *replies):
        with self._lock:
            self._replies = list(replies)

    def next_reply(self, body):
        with self._lock:
            self.requests.append(body)
            return self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]


def _handler_for(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'

        def log_message(self, *args):  # keep test output quiet
            pass

        def do_POST(self):
            length = int(self.headers.get('Content-Length') or 0)
            body = json.loads(self.rfile.read(length) or b'{}')
            body['_headers'] = {name.lower(): value for name, value in self.headers.items()}
            reply = fake.next_reply(body)
            if reply.status != 200:
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
