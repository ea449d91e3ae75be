"""A real HTTP server on 127.0.0.1 that speaks OpenAI's files and batches API as documented
(https://platform.openai.com/docs/api-reference/batch), on the same port as the chat completions
of ``FakeOpenAI``, so one base URL serves the online path and the batch path.

A test drives each batch: ``mode = 'auto'`` moves it validating -> in_progress -> finalizing ->
completed, one step per GET of it; ``mode = 'manual'`` leaves it where ``set_status`` puts it.
Completing a batch writes its output file (each line answered by ``answer``) and its error file
(the lines ``fail_line`` picked, and on ``expire`` the lines left unanswered). Hooks (``on``) run
after the fake did the work and before the reply goes out; a hook that raises makes the fake hang
up without replying, as a provider whose answer never reached the caller."""

import email.parser
import email.policy
import itertools
import json
import threading
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from .fake_openai import FakeOpenAI, _handler_for

STATUSES = (
    'validating',
    'in_progress',
    'finalizing',
    'completed',
    'expired',
    'cancelling',
    'cancelled',
    'failed',
)
AUTO_NEXT = {'validating': 'in_progress', 'in_progress': 'finalizing', 'finalizing': 'completed'}
HOOK_EVENTS = ('upload', 'create_batch', 'retrieve_batch', 'content')
# What OpenAI writes in the error file for a request a batch never ran.
EXPIRED_ERROR = {
    'code': 'batch_expired',
    'message': 'This request could not be executed before the completion window expired.',
}
CANCELLED_ERROR = {
    'code': 'batch_cancelled',
    'message': 'This request could not be executed because the batch was cancelled.',
}


class FakeHttpError(Exception):
    """An error answer: ``status`` with OpenAI's error body."""

    def __init__(self, status, message, code=None, error_type='invalid_request_error'):
        super().__init__(message)
        self.status = status
        self.body = {'error': {'message': message, 'type': error_type, 'param': None, 'code': code}}


class FakeBatchApi(FakeOpenAI):
    def __init__(self, port=0, models=('fake-model',)):
        self.mode = 'auto'
        self.page_limit = None  # a server-side cap on a list page (to test paging)
        self.api_key = None  # set: a request with another bearer key gets 401
        self.line_usage = {'prompt_tokens': 11, 'completion_tokens': 7}
        # Records.
        self.files = {}  # id -> {'object': the file object, 'content': bytes}
        self.uploads = []  # each uploaded input file: {'id', 'filename', 'content'}
        self.batches = {}  # id -> the batch object as the API answers it
        self.submitted_custom_ids = []  # every custom_id of every created batch, in order
        self.cancelled_batch_ids = []  # each batch a cancel request moved to cancelling
        self._inputs = {}  # batch id -> its input lines
        self._failures = []  # (predicate, status_code, code)
        self._refusals = []  # statuses the next requests get
        self._hooks = {}
        self._ids = itertools.count(1)
        super().__init__(port, models)
        # Reentrant: a test's ``answer`` may read the fake while a batch is being completed.
        self._lock = threading.RLock()

    def _bind(self, port):
        self._server = ThreadingHTTPServer(('127.0.0.1', port), _batch_handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )

    # ------------------------------------------------------------------ what a test drives
    def answer(self, body):
        """The JSON object the model returns for a line's request ``body``; a test may replace
        it (``fake.answer = fn``). By default the chat-completions fake's current reply."""
        with self._lock:
            reply = self._replies[0]
        return json.loads(reply.content)

    def fail_line(self, which, status_code=500, code='server_error'):
        """The line(s) ``which`` picks (a custom_id, or a predicate on the input line) go to the
        error file with that HTTP status and error code."""
        predicate = which if callable(which) else (lambda line: line['custom_id'] == which)
        with self._lock:
            self._failures.append((predicate, status_code, code))

    def refuse(self, status, times=1, code=None):
        """The next ``times`` files/batches requests answer HTTP ``status`` (429 with
        Retry-After) and change nothing."""
        with self._lock:
            self._refusals.extend([(status, code)] * times)

    def on(self, event, callback):
        """``callback(obj)`` runs before the reply to ``event`` (one of HOOK_EVENTS) is sent,
        with the object about to be answered; None removes it."""
        assert event in HOOK_EVENTS, event
        self._hooks[event] = callback

    def set_status(self, batch_id, status):
        """Put a batch in ``status``; an ended status writes its files as OpenAI would."""
        assert status in STATUSES, status
        with self._lock:
            self._move(self.batches[batch_id], status)

    def expire(self, batch_id, complete_first=0):
        """The batch expires with its first ``complete_first`` lines answered; the rest go to
        the error file as ``batch_expired``."""
        with self._lock:
            self._end(self.batches[batch_id], 'expired', complete_first)

    def lines_of(self, file_id):
        """A stored file's JSONL, one dict per line (to check what the fake wrote)."""
        content = self.files[file_id]['content']
        return [json.loads(text) for text in content.splitlines() if text.strip()]

    # ------------------------------------------------------------------ the API's state
    def _new_id(self, prefix):
        return '%s%06d' % (prefix, next(self._ids))

    def _store_file(self, filename, content, purpose):
        file = {
            'id': self._new_id('file-'),
            'object': 'file',
            'bytes': len(content),
            'created_at': int(time.time()),
            'expires_at': None,
            'filename': filename,
            'purpose': purpose,
            'status': 'processed',
            'status_details': None,
        }
        self.files[file['id']] = {'object': file, 'content': content}
        return file

    def upload(self, filename, content, purpose):
        if purpose != 'batch':
            raise FakeHttpError(400, 'This fake only takes purpose batch.', 'invalid_purpose')
        if not filename.endswith('.jsonl'):
            raise FakeHttpError(400, 'A batch input file must be .jsonl.', 'invalid_file_format')
        with self._lock:
            file = self._store_file(filename, content, purpose)
            self.uploads.append({'id': file['id'], 'filename': filename, 'content': content})
            return dict(file)

    def file_object(self, file_id):
        with self._lock:
            return dict(self._file(file_id)['object'])

    def file_content(self, file_id):
        with self._lock:
            file = self._file(file_id)
            if file['object']['purpose'] == 'batch':  # OpenAI keeps input files write-only
                raise FakeHttpError(400, 'Not allowed to download files of purpose: batch')
            return file['content']

    def list_files(self, query):
        purpose = query.get('purpose')
        with self._lock:
            files = [
                f['object']
                for f in self.files.values()
                if purpose is None or f['object']['purpose'] == purpose
            ]
        if query.get('order', 'desc') == 'desc':
            files = files[::-1]
        return self._page(files, query, default_limit=10000)

    def create_batch(self, body):
        if body.get('endpoint') != '/v1/chat/completions':
            raise FakeHttpError(400, 'This fake only batches /v1/chat/completions.', 'invalid')
        if body.get('completion_window') != '24h':
            raise FakeHttpError(400, 'completion_window must be 24h.', 'invalid')
        with self._lock:
            file = self._file(body.get('input_file_id'))
            lines = _input_lines(file['content'])
            batch = self._new_batch(body, len(lines))
            self.batches[batch['id']] = batch
            self._inputs[batch['id']] = lines
            self.submitted_custom_ids.extend(line['custom_id'] for line in lines)
            return dict(batch)

    def retrieve_batch(self, batch_id):
        with self._lock:
            batch = self._batch(batch_id)
            if batch['status'] == 'cancelling':
                self._move(batch, 'cancelled')
            elif self.mode == 'auto' and batch['status'] in AUTO_NEXT:
                self._move(batch, AUTO_NEXT[batch['status']])
            return dict(batch)

    def list_batches(self, query):
        with self._lock:
            batches = [dict(b) for b in self.batches.values()][::-1]  # newest first
        return self._page(batches, query, default_limit=20)

    def cancel_batch(self, batch_id):
        with self._lock:
            batch = self._batch(batch_id)
            if batch['status'] in ('completed', 'expired', 'failed'):
                raise FakeHttpError(
                    400, 'Cannot cancel a batch with status %s.' % batch['status'], 'invalid'
                )
            if batch['status'] not in ('cancelling', 'cancelled'):
                batch['status'] = 'cancelling'
                batch['cancelling_at'] = int(time.time())
                self.cancelled_batch_ids.append(batch_id)
            return dict(batch)

    def take_refusal(self):
        with self._lock:
            return self._refusals.pop(0) if self._refusals else None

    def run_hook(self, event, obj):
        callback = self._hooks.get(event)
        if callback is not None:
            callback(obj)

    # ------------------------------------------------------------------ helpers (under _lock)
    def _file(self, file_id):
        if file_id not in self.files:
            raise FakeHttpError(404, 'No such File object: %s' % file_id)
        return self.files[file_id]

    def _batch(self, batch_id):
        if batch_id not in self.batches:
            raise FakeHttpError(404, 'No batch found with id %s.' % batch_id)
        return self.batches[batch_id]

    def _page(self, items, query, default_limit):
        limit = int(query.get('limit', default_limit))
        if self.page_limit is not None:
            limit = min(limit, self.page_limit)
        after = query.get('after')
        ids = [item['id'] for item in items]
        start = ids.index(after) + 1 if after in ids else 0
        data = items[start : start + limit]
        return {
            'object': 'list',
            'data': data,
            'first_id': data[0]['id'] if data else None,
            'last_id': data[-1]['id'] if data else None,
            'has_more': start + limit < len(items),
        }

    def _new_batch(self, body, total):
        now = int(time.time())
        return {
            'id': self._new_id('batch_'),
            'object': 'batch',
            'endpoint': body['endpoint'],
            'errors': None,
            'input_file_id': body['input_file_id'],
            'completion_window': '24h',
            'status': 'validating',
            'output_file_id': None,
            'error_file_id': None,
            'created_at': now,
            'in_progress_at': None,
            'expires_at': now + 24 * 3600,
            'finalizing_at': None,
            'completed_at': None,
            'failed_at': None,
            'expired_at': None,
            'cancelling_at': None,
            'cancelled_at': None,
            'request_counts': {'total': total, 'completed': 0, 'failed': 0},
            'metadata': body.get('metadata') or None,
        }

    def _move(self, batch, status):
        if status == 'completed':
            return self._end(batch, status, len(self._inputs[batch['id']]))
        if status in ('expired', 'cancelled'):
            return self._end(batch, status, 0)  # nothing ran: every line in the error file
        batch['status'] = status
        if status + '_at' in batch:
            batch[status + '_at'] = int(time.time())
        if status == 'failed':
            batch['errors'] = {
                'object': 'list',
                'data': [{'code': 'invalid_request', 'message': 'The batch failed.', 'line': None}],
            }

    def _end(self, batch, status, answered):
        """Write the output and error files once: the first ``answered`` lines run (each
        answered, or failed by ``fail_line``), the rest never ran."""
        batch['status'] = status
        batch[status + '_at'] = int(time.time())
        if batch['output_file_id'] or batch['error_file_id']:
            return
        unran = EXPIRED_ERROR if status == 'expired' else CANCELLED_ERROR
        outputs, errors = [], []
        for number, line in enumerate(self._inputs[batch['id']]):
            if number >= answered:
                errors.append(_error_line(self._new_id('batch_req_'), line, unran))
                continue
            failure = next((f for f in self._failures if f[0](line)), None)
            if failure is None:
                outputs.append(self._output_line(line))
            else:
                errors.append(self._failed_line(line, failure[1], failure[2]))
        batch['request_counts'] = {
            'total': len(outputs) + len(errors),
            'completed': len(outputs),
            'failed': len(errors),
        }
        name = batch['id']
        if outputs:
            batch['output_file_id'] = self._result_file(name + '_output.jsonl', outputs)
        if errors:
            batch['error_file_id'] = self._result_file(name + '_error.jsonl', errors)

    def _result_file(self, filename, lines):
        content = b''.join(json.dumps(line).encode() + b'\n' for line in lines)
        return self._store_file(filename, content, 'batch_output')['id']

    def _output_line(self, line):
        content = json.dumps(self.answer(line['body']))
        usage = dict(self.line_usage, total_tokens=sum(self.line_usage.values()))
        completion = {
            'id': self._new_id('chatcmpl-'),
            'object': 'chat.completion',
            'created': int(time.time()),
            'model': line['body'].get('model', 'fake-model'),
            'choices': [
                {
                    'index': 0,
                    'finish_reason': 'stop',
                    'message': {'role': 'assistant', 'content': content, 'refusal': None},
                }
            ],
            'usage': usage,
        }
        return self._response_line(line, 200, completion)

    def _failed_line(self, line, status_code, code):
        error_type = 'server_error' if status_code >= 500 else 'invalid_request_error'
        body = {'error': {'message': 'The request failed.', 'type': error_type, 'code': code}}
        return self._response_line(line, status_code, body)

    def _response_line(self, line, status_code, body):
        return {
            'id': self._new_id('batch_req_'),
            'custom_id': line['custom_id'],
            'response': {
                'status_code': status_code,
                'request_id': self._new_id('req_'),
                'body': body,
            },
            'error': None,
        }


def _error_line(line_id, line, error):
    return {'id': line_id, 'custom_id': line['custom_id'], 'response': None, 'error': error}


def _input_lines(content):
    """The requests of a batch input file, checked as OpenAI's validation does."""
    lines, seen = [], set()
    for number, text in enumerate(content.splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            raise FakeHttpError(400, 'Line %d is not JSON.' % number, 'invalid_json_line') from None
        valid = (
            isinstance(line, dict)
            and isinstance(line.get('custom_id'), str)
            and line.get('method') == 'POST'
            and line.get('url') == '/v1/chat/completions'
            and isinstance(line.get('body'), dict)
        )
        if not valid:
            raise FakeHttpError(400, 'Line %d is not a batch request.' % number, 'invalid_request')
        if line['custom_id'] in seen:
            raise FakeHttpError(400, 'Duplicate custom_id on line %d.' % number, 'duplicate')
        seen.add(line['custom_id'])
        lines.append(line)
    if not lines:
        raise FakeHttpError(400, 'The input file has no requests.', 'empty_file')
    return lines


def _multipart_fields(content_type, data):
    """{name: (filename, bytes)} of a multipart/form-data body."""
    head = b'Content-Type: ' + content_type.encode() + b'\r\n\r\n'
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + data)
    fields = {}
    for part in message.iter_parts():
        name = part.get_param('name', header='content-disposition')
        fields[name] = (part.get_filename(), part.get_payload(decode=True))
    return fields


def _batch_handler_for(fake):
    """The chat-completions handler plus the files and batches routes."""

    class Handler(_handler_for(fake)):
        def do_GET(self):
            url = urlsplit(self.path)
            parts = url.path.strip('/').split('/')
            if parts[:2] not in (['v1', 'files'], ['v1', 'batches']):
                return super().do_GET()
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            self._serve(lambda: self._get(parts[1:], query))

        def do_POST(self):
            parts = urlsplit(self.path).path.strip('/').split('/')
            if parts[:2] not in (['v1', 'files'], ['v1', 'batches']):
                return super().do_POST()
            body = self._body()
            self._serve(lambda: self._post(parts[1:], body))

        def _get(self, parts, query):
            if parts == ['files']:
                return None, fake.list_files(query)
            if len(parts) == 2 and parts[0] == 'files':
                return None, fake.file_object(parts[1])
            if len(parts) == 3 and parts[0] == 'files' and parts[2] == 'content':
                fake.file_content(parts[1])  # refused before the hook runs
                return 'content', fake.file_object(parts[1])
            if parts == ['batches']:
                return None, fake.list_batches(query)
            if len(parts) == 2:
                return 'retrieve_batch', fake.retrieve_batch(parts[1])
            raise FakeHttpError(404, 'Unknown path.')

        def _post(self, parts, body):
            if parts == ['files']:
                fields = _multipart_fields(self.headers.get('Content-Type', ''), body)
                filename, content = fields.get('file', (None, None))
                if content is None:
                    raise FakeHttpError(400, 'No file part.', 'missing_file')
                purpose = (fields.get('purpose', (None, b''))[1] or b'').decode()
                return 'upload', fake.upload(filename or '', content, purpose)
            if parts == ['batches']:
                return 'create_batch', fake.create_batch(json.loads(body or b'{}'))
            if len(parts) == 3 and parts[2] == 'cancel':
                return None, fake.cancel_batch(parts[1])
            raise FakeHttpError(404, 'Unknown path.')

        def _body(self):
            if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
                return self._chunked_body()
            return self.rfile.read(int(self.headers.get('Content-Length') or 0))

        def _chunked_body(self):
            data = b''
            while True:
                size = int(self.rfile.readline().split(b';')[0], 16)
                data += self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    return data

        def _serve(self, handle):
            """Answer ``handle()`` -> (hook event, object), or the error it raised."""
            refused = self._refusal()
            if refused:
                return
            try:
                event, obj = handle()
            except FakeHttpError as exc:
                return self._send_json(exc.status, exc.body, {})
            try:
                if event:
                    fake.run_hook(event, obj)
            except Exception:
                self.close_connection = True  # the work is done, the answer never leaves
                return
            if event == 'content':
                return self._send_bytes(fake.file_content(obj['id']))
            self._send_json(200, obj, {})

        def _refusal(self):
            bearer = self.headers.get('Authorization', '')
            if fake.api_key is not None and bearer != 'Bearer %s' % fake.api_key:
                body = FakeHttpError(401, 'Incorrect API key provided.', 'invalid_api_key').body
                self._send_json(401, body, {})
                return True
            refusal = fake.take_refusal()
            if refusal is None:
                return False
            status, code = refusal
            error_type = 'server_error' if status >= 500 else 'invalid_request_error'
            body = FakeHttpError(status, 'Refused by the test.', code, error_type).body
            self._send_json(status, body, {'Retry-After': '1'} if status == 429 else {})
            return True

        def _send_bytes(self, data):
            self.send_response(200)
            self.send_header('Content-Type', 'application/octet-stream')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def batch_fake():
    """A FakeBatchApi server on loopback for one test (chat completions and the batch API)."""
    server = FakeBatchApi().start()
    yield server
    server.stop()
