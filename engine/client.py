"""The command-line client of a running server (README "Following a job from a terminal"):
``submit`` creates a job and, with ``--wait``, follows it to its end; ``jobs`` lists recent
jobs. It speaks only the public HTTP API (standard library only, nothing of the engine), so it
works against any ``serve`` or ``web``, local or remote.

Exit codes: 0 succeeded (or created, without ``--wait``), 1 failed, 130 cancelled or
interrupted, 2 a usage, connection or API error.
"""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

EXIT_OK, EXIT_FAILED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
TERMINAL = ('succeeded', 'failed', 'cancelled')
WAIT_MS = 25_000  # one long poll; the server caps waitMs at 30 000
GIVE_UP_S = 60.0  # the server unreachable this long while following: stop (the job goes on)
STREAM_READ_S = 60.0  # a stream silent this long is dead (the server sends a keepalive each 15 s)
BAR_WIDTH = 30


class ClientError(Exception):
    """An answer the command cannot go on from (the API's error code and message)."""

    def __init__(self, message, code=None, status=None, retry_after=None):
        super().__init__(message)
        self.code, self.status, self.retry_after = code, status, retry_after


@dataclass
class Reply:
    status: int
    headers: dict
    body: object  # parsed JSON, or None


class Api:
    """The few calls the CLI makes, with the bearer token."""

    def __init__(self, url, token):
        self.url = url.rstrip('/')
        self.token = token

    def open_stream(self, path, last_event_id, timeout_s):
        """The response of a server-sent event stream, to be read line by line (204 too)."""
        headers = {'Accept': 'text/event-stream'}
        if last_event_id is not None:
            headers['Last-Event-ID'] = last_event_id
        answer = self._open('GET', path, None, headers, timeout_s)
        if isinstance(answer, Reply):
            raise _api_error(answer)
        return answer

    def call(self, method, path, body=None, headers=None, timeout_s=30.0, ok=(200, 201, 202)):
        data = json.dumps(body).encode('utf-8') if body is not None else None
        all_headers = {'Accept': 'application/json'}
        if data is not None:
            all_headers['Content-Type'] = 'application/json'
        all_headers.update(headers or {})
        answer = self._open(method, path, data, all_headers, timeout_s)
        if not isinstance(answer, Reply):
            try:
                with answer:
                    answer = _reply(answer.status, answer.headers, answer.read())
            except OSError as exc:
                raise self._unreachable(exc) from None
        if answer.status not in ok:
            raise _api_error(answer)
        return answer

    def _open(self, method, path, data, headers, timeout_s):
        """The open response of one request with the bearer token, or the Reply of an HTTP
        error status; ClientError when the server cannot be reached."""
        headers = dict(headers, Authorization='Bearer ' + self.token)
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=timeout_s)
        except urllib.error.HTTPError as error:
            return _reply(error.code, error.headers, error.read())
        except (urllib.error.URLError, OSError) as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc):
        return ClientError('cannot reach %s: %s' % (self.url, getattr(exc, 'reason', exc)))


def _reply(status, headers, raw):
    body = None
    if raw:
        try:
            body = json.loads(raw.decode('utf-8'))
        except ValueError:
            body = None
    return Reply(status, {k.lower(): v for k, v in headers.items()}, body)


def _api_error(reply):
    error = (reply.body or {}).get('error') if isinstance(reply.body, dict) else None
    code = error.get('code') if error else 'HTTP_%d' % reply.status
    message = error.get('message') if error else 'the server answered %d' % reply.status
    retry_after = reply.headers.get('retry-after')
    return ClientError(
        '%s: %s' % (code, message),
        code=code,
        status=reply.status,
        retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
    )


# ---------------------------------------------------------------- submit
def parse_target(raw):
    """``TYPE:ID`` → (type, id)."""
    if raw is None:
        return None, None
    kind, sep, ident = raw.partition(':')
    if not sep or not kind or not ident:
        raise ClientError('--target must be TYPE:ID, e.g. note:42')
    return kind, ident


def parse_input(raw):
    """A JSON object, given inline or as ``@FILE``."""
    if raw is None:
        return {}
    if raw.startswith('@'):
        try:
            with open(raw[1:], encoding='utf-8') as handle:
                raw = handle.read()
        except OSError as exc:
            raise ClientError('--input: cannot read %s: %s' % (raw[1:], exc.strerror)) from None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ClientError('--input is not JSON: %s' % exc) from None
    if not isinstance(value, dict):
        raise ClientError('--input must be a JSON object')
    return value


def submit(args, out=sys.stdout, err=sys.stderr):
    if args.stream and not args.wait:
        raise ClientError('--stream follows the job: give --wait too')
    api = Api(args.url, args.token)
    target_type, target_id = parse_target(args.target)
    body = {'jobType': args.job_type, 'input': parse_input(args.input)}
    if target_type is not None:
        body.update(targetType=target_type, targetId=target_id)
    headers = {'Idempotency-Key': args.idempotency_key} if args.idempotency_key else None
    job = api.call('POST', '/api/ai/jobs', body, headers).body
    if not args.wait:
        print(job['jobId'], file=out)
        print('job %s %s' % (job['jobId'], job['lifecycleStatus']), file=err)
        return EXIT_OK
    follower = StreamFollower if args.stream else Follower
    return follower(api, job, out, err, interactive=_interactive(err)).run()


def _interactive(err):
    try:
        return sys.stdin.isatty() and err.isatty()
    except (AttributeError, ValueError):
        return False


class Follower:
    """Follows one job by long polls until it ends; Ctrl-C asks whether to cancel it (on a
    terminal), or cancels it (otherwise)."""

    def __init__(self, api, job, out, err, interactive):
        self.api, self.job, self.out, self.err = api, job, out, err
        self.interactive = interactive
        self.etag = None
        self.shown = None  # what the display last said
        self.started = time.monotonic()

    def run(self):
        # The default handler even when started with SIGINT ignored: Ctrl-C must reach us.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.show()
        while self.job['lifecycleStatus'] not in TERMINAL:
            try:
                self.poll()
            except KeyboardInterrupt:
                stop = self.on_interrupt()
                if stop is not None:
                    return stop
        return self.finish()

    def poll(self):
        """One long poll (with the retries an outage needs); updates the display."""
        reply = self.retrying(self.long_poll)
        if reply.status == 200:
            self.job, self.etag = reply.body, reply.headers.get('etag')
        self.show()

    def long_poll(self):
        return self.api.call(
            'GET',
            '/api/ai/jobs/%s?waitMs=%d' % (self.job['jobId'], WAIT_MS),
            headers={'If-None-Match': self.etag} if self.etag else None,
            timeout_s=WAIT_MS / 1000.0 + 15,
            ok=(200, 304),
        )

    def retrying(self, attempt):
        """``attempt()``'s result, tried again while the server is away (no connection, 429,
        502-504) for up to GIVE_UP_S, each wait said on stderr: a restart or a deploy of the
        server must not end the wait."""
        deadline = time.monotonic() + GIVE_UP_S
        delay_s = 0.5
        while True:
            try:
                return attempt()
            except ClientError as exc:
                if exc.status not in (None, 429, 502, 503, 504) or time.monotonic() > deadline:
                    raise
                self.note('waiting for the server (%s)' % exc)
                time.sleep(exc.retry_after or delay_s)
                delay_s = min(5.0, delay_s * 2)

    # -- Ctrl-C
    def on_interrupt(self):
        """None to go on following; else the exit code."""
        job_id = self.job['jobId']
        if not self.interactive:
            if self.cancel():
                print('interrupted: cancel requested for job %s' % job_id, file=self.err)
            else:
                print('interrupted: job %s was not cancelled' % job_id, file=self.err)
            return EXIT_INTERRUPTED
        self.end_line()
        try:
            answer = self.ask('Cancel job %s? [y]es / [n]o, keep following / [d]etach: ' % job_id)
        except (KeyboardInterrupt, EOFError):
            answer = 'd'
        if answer.startswith('y'):
            self.cancel()
            return None  # follow it to `cancelled` (or to the end it reached first)
        if answer.startswith('d'):
            print(
                '\ndetached: job %s goes on; python aijob.py jobs shows it' % job_id,
                file=self.err,
            )
            return EXIT_INTERRUPTED
        return None

    def ask(self, question):
        self.err.write(question)
        self.err.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.strip().lower()

    def cancel(self):
        """Ask the server to cancel the job; False when it did not (finished meanwhile, or the
        server is away), with the reason shown."""
        try:
            reply = self.api.call('POST', '/api/ai/jobs/%s/cancel' % self.job['jobId'])
        except ClientError as exc:
            print('cancel: %s' % exc, file=self.err)
            return False
        self.job = reply.body
        self.show()
        return True

    # -- the end
    def finish(self):
        self.end_line()
        status = self.job['lifecycleStatus']
        if status == 'succeeded':
            reply = self.api.call('GET', '/api/ai/jobs/%s/artifacts' % self.job['jobId'])
            print(json.dumps(reply.body, indent=2, ensure_ascii=False), file=self.out)
            return EXIT_OK
        if status == 'failed':
            print(
                'job %s failed: %s: %s'
                % (
                    self.job['jobId'],
                    self.job.get('errorCode'),
                    self.job.get('publicErrorMessage', ''),
                ),
                file=self.err,
            )
            return EXIT_FAILED
        print('job %s cancelled' % self.job['jobId'], file=self.err)
        return EXIT_INTERRUPTED

    # -- display: a bar redrawn in place on a terminal, a line per change otherwise
    def show(self):
        job = self.job
        state = (job['lifecycleStatus'], job.get('progress', 0))
        elapsed = time.monotonic() - self.started
        if self.interactive:
            done = BAR_WIDTH * min(100, max(0, state[1])) // 100
            bar = '#' * done + '.' * (BAR_WIDTH - done)
            self.err.write(
                '\r\x1b[K%s [%s] %3d%% %-9s %5.1fs'
                % (job['jobId'][:8], bar, state[1], state[0], elapsed)
            )
            self.err.flush()
        elif state != self.shown:
            print(
                'job %s %s %d%% %.1fs' % (job['jobId'], state[0], state[1], elapsed),
                file=self.err,
                flush=True,
            )
        self.shown = state

    def note(self, text):
        self.end_line()
        print(text, file=self.err, flush=True)

    def end_line(self):
        if self.interactive:
            self.err.write('\n')
            self.err.flush()


class StreamFollower(Follower):
    """``--wait --stream``: follows the job's event stream instead of long polls and prints the
    text its AI provider streams on stdout as it arrives (the artifacts follow at the end, as
    with ``--wait``). Status changes are lines on stderr; a retry that starts the text over is
    said there too. A stream the server closes (its time cap) is resumed with Last-Event-ID."""

    def __init__(self, api, job, out, err, interactive):
        super().__init__(api, job, out, err, interactive)
        self.last_event_id = None
        self.mid_line = False  # the text printed so far does not end with a newline

    def poll(self):
        """One stream, until the server closes it (with the retries an outage needs)."""
        self.retrying(self.read_stream)

    def read_stream(self):
        path = '/api/ai/jobs/%s/stream' % self.job['jobId']
        answer = self.api.open_stream(path, self.last_event_id, STREAM_READ_S)
        with answer:
            if answer.status == 204:  # it had ended after our last event: read the status
                self.job = self.api.call('GET', '/api/ai/jobs/%s' % self.job['jobId']).body
                return
            fields = {}
            try:
                for raw in answer:
                    line = raw.decode('utf-8').rstrip('\r\n')
                    if line:
                        name, _, value = line.partition(':')
                        fields[name] = value[1:] if value.startswith(' ') else value
                        continue
                    self.on_event(fields)
                    fields = {}
            except OSError as exc:  # the connection dropped mid-stream: resume
                raise ClientError('the stream broke off: %s' % exc) from None

    def on_event(self, fields):
        if 'id' in fields:
            self.last_event_id = fields['id']
        event = fields.get('event')
        if event is None or 'data' not in fields:
            return  # a comment (keepalive) or the reconnect delay
        data = json.loads(fields['data'])
        if event == 'delta':
            self.out.write(data['text'])
            self.out.flush()
            self.mid_line = not data['text'].endswith('\n')
        elif event == 'reset':
            self.note('(attempt %d starts the text over)' % data['attempt'])
        elif event == 'status':
            self.job = data
            self.show()
        elif event in ('started', 'taken_over'):
            self.job = dict(self.job, lifecycleStatus='running')
            self.show()
        elif event == 'retry_scheduled':
            self.note('(retrying after %s)' % data['detail'].get('errorCode'))

    def show(self):
        """A line per change of status (progress would break the text's lines)."""
        state = self.job['lifecycleStatus']
        if state != self.shown:
            self.note('job %s %s' % (self.job['jobId'], state))
        self.shown = state

    def end_line(self):  # note() (Follower's) ends the streamed text's line with this
        if self.mid_line:
            self.out.write('\n')
            self.out.flush()
            self.mid_line = False


# ---------------------------------------------------------------- jobs
COLUMNS = (
    ('JOB ID', 'jobId'),
    ('TYPE', 'jobType'),
    ('STATUS', 'lifecycleStatus'),
    ('PROG', 'progress'),
    ('QUEUE', 'queueName'),
    ('USER', 'userId'),
    ('CREATED', 'createdAt'),
    ('ERROR', 'errorCode'),
)


def list_jobs(args, out=sys.stdout):
    """The newest jobs the token can see: every user's for an admin token (the admin list),
    else the caller's own; ``--mine`` asks for one's own either way."""
    api = Api(args.url, args.token)
    query = {'limit': str(args.limit)}
    if args.status:
        query['lifecycleStatus'] = args.status
    if args.job_type:
        query['jobType'] = args.job_type
    encoded = urllib.parse.urlencode(query)
    page = None
    if not args.mine:
        try:
            page = api.call('GET', '/admin-api/ai/jobs?' + encoded).body
        except ClientError as exc:
            if exc.code != 'FORBIDDEN':
                raise
    if page is None:
        page = api.call('GET', '/api/ai/jobs?' + encoded).body
    print(table(page['items']), file=out)
    return EXIT_OK


def table(items):
    columns = [(title, key) for title, key in COLUMNS if any(key in item for item in items)]
    if not items:
        return 'no jobs'
    columns = columns or COLUMNS[:3]
    rows = [[title for title, _ in columns]]
    rows += [[_cell(item.get(key)) for _, key in columns] for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return '\n'.join(
        '  '.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _cell(value):
    if value is None:
        return '-'
    return str(value)


# ---------------------------------------------------------------- arguments
def connection_args(parser):
    parser.add_argument('--url', help='the server (default AIJOB_URL, else http://127.0.0.1:PORT)')
    parser.add_argument(
        '--token', default=os.environ.get('AIJOB_TOKEN'), help='bearer token (default AIJOB_TOKEN)'
    )


def submit_args(parser):
    parser.add_argument('job_type', metavar='JOB_TYPE', help='e.g. synthetic, flashcards')
    parser.add_argument(
        '--target', metavar='TYPE:ID', required=True, help='what the job is about, e.g. note:42'
    )
    parser.add_argument('--input', metavar='JSON', help='the job input: a JSON object, or @FILE')
    parser.add_argument('--idempotency-key', help='the same key returns the same job')
    parser.add_argument(
        '--wait',
        action='store_true',
        help='follow the job to its end (exit 0 succeeded, 1 failed, 130 cancelled/interrupted)',
    )
    parser.add_argument(
        '--stream',
        action='store_true',
        help='with --wait: print the text the AI model writes as it arrives (on stdout)',
    )
    connection_args(parser)


def jobs_args(parser):
    parser.add_argument('--limit', type=int, default=20, help='how many (1-100, default 20)')
    parser.add_argument('--status', help='only these lifecycle statuses (comma-separated)')
    parser.add_argument('--type', dest='job_type', help='only this job type')
    parser.add_argument(
        '--mine', action='store_true', help="one's own jobs even with an admin token"
    )
    connection_args(parser)


def run(command, args, port):
    """Run ``submit`` or ``jobs``; returns the exit code. ``port``: AIJOB_PORT, for the default
    URL of a local server."""
    args.url = args.url or os.environ.get('AIJOB_URL') or 'http://127.0.0.1:%d' % port
    if not args.token:
        print('aijob: error: give --token or set AIJOB_TOKEN', file=sys.stderr)
        return EXIT_ERROR
    try:
        return submit(args) if command == 'submit' else list_jobs(args)
    except ClientError as exc:
        print('aijob: error: %s' % exc, file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # before a job existed, or while listing
        print('interrupted', file=sys.stderr)
        return EXIT_INTERRUPTED
