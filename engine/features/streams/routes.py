"""The job stream resource: ``GET /api/ai/jobs/{id}/stream``, a job's history and live text
as server-sent events (stream.py writes them), and its part of the OpenAPI document."""

import bottle

from ...core.history import JobHistory
from ...core.logs import log_event
from ...core.states import TERMINAL
from ...http import parsing, views
from ...http.openapi import error_responses, path_param
from ...http.waiter import GONE_CHECK_S, client_gone
from . import stream, text_feed

# OpenAPI 3.1: a text/event-stream schema describes each event (its fields as sent).
SSE_EVENT = {
    'type': 'object',
    'properties': {
        'event': {'type': 'string'},
        'data': {
            'type': 'string',
            'description': 'JSON: the status, the event row, `{attempt, offset, text}` (delta) '
            'or `{attempt}` (reset).',
        },
        'id': {'type': 'string', 'pattern': '^[0-9]+(-[1-9][0-9]*-[0-9]+)?$'},
        'retry': {'type': 'integer'},
    },
}


class JobStreams:
    """GET /api/ai/jobs/{id}/stream, over the feature's handle (extension.LiveStreams: the text
    channel and feed, and the watch that caps the streams this process holds)."""

    def __init__(self, live, runtime, access):
        self.live = live
        self.runtime = runtime
        self.store = runtime.store
        self.access = access

    def routes(self):
        return (('GET', '/api/ai/jobs/<job_id>/stream', self.stream_job, False),)  # own connections

    def paths(self):
        return _paths()

    def schemas(self):
        return {}

    def stream_job(self, job_id):
        """The job's live event stream (stream.py). Everything that can be refused is refused
        here, as a JSON error, before the first byte of the stream; the route holds no database
        connection while the stream runs (``db=False``)."""
        with self.store.connection():
            principal = self.access.job_caller()
            position = stream.parse_last_event_id(parsing.header('Last-Event-ID'))
            fresh = position is None
            if fresh:
                # The latest event id before the status (READ COMMITTED): a change committed
                # between the two reads is in the status and is also sent as the next event,
                # never lost.
                latest = stream.latest_event_ids([job_id]).get(job_id, 0)
                position = stream.Position(latest)
            job, refs = self.access.visible_status(job_id, principal)
            ended = job.lifecycle_status in TERMINAL
            after_id = position.history_id
            if not fresh and ended and not JobHistory(self.store).list(job_id, after_id, 1):
                # Nothing after the client's last event and nothing will come: 204 tells an
                # EventSource to stop reconnecting.
                return bottle.HTTPResponse(status=204, headers={'Cache-Control': 'no-store'})
        opening = None
        if fresh:
            opening = stream.message('status', views.status_body(job, refs), str(after_id))
        waiter = self.live.watch.enter(job_id, self.access.wait_key(principal, job))
        # The live text only while the job runs: a stream opened after its end gets its final
        # status, as one that never saw text would.
        text = None
        if not ended:
            text = text_feed.TextFollower(
                self.live.channel, self.live.feed, waiter, position.attempt, position.offset
            )
        config = self.runtime.config
        settings = (config.stream_heartbeat_ms / 1000.0, config.stream_max_s, GONE_CHECK_S)
        environ = bottle.request.environ
        body = stream.JobStream(
            self.store,
            self.live.watch,
            waiter,
            position,
            opening,
            settings,
            lambda: client_gone(environ),
            fresh and ended,
            text,
        )
        log_event('http.stream_opened', job_id=job_id, user_id=principal.user_id)
        headers = {
            'Content-Type': stream.CONTENT_TYPE,
            'Cache-Control': 'no-store',
            'X-Accel-Buffering': 'no',  # a proxy in front must pass each event on at once
        }
        return bottle.HTTPResponse(body=body, status=200, headers=headers)


def _paths():
    return {
        '/api/ai/jobs/{jobId}/stream': {
            'get': {
                'summary': 'Server-sent events of one job (owner or SUPER_ADMIN) until it ends.',
                'description': 'A fresh stream opens with `event: status` (the JobStatusResponse, '
                'its id the latest event id), then one event per change, named by its kind '
                '(created, dispatched, started, progress, retry_scheduled, fallback, taken_over, '
                'cancel_requested, succeeded, failed, cancelled, ...), data `{id, jobId, kind, '
                'attemptNo, detail, at}`, then the final `event: status`, then it ends. While '
                'the job runs, the text its provider streams comes as `event: delta`, data '
                '`{attempt, offset, text}` (offset: characters of that attempt before this '
                'text), at most one per 100 ms; a retry or fallback starts a new attempt with '
                '`event: reset`, data `{attempt}`: drop the text so far. An event id is '
                '`<historyId>` until the client has text, then `<historyId>-<attempt>-<offset>` '
                '(the text it has). With Last-Event-ID only the events after it are sent, the '
                'text from where the client is (a plain history id: the current attempt from '
                'its start); after the job has ended, no text. Idle: a comment line every '
                'AIJOB_STREAM_HEARTBEAT_MS; closed after AIJOB_STREAM_MAX_S.',
                'parameters': [
                    path_param('jobId'),
                    {
                        'name': 'Last-Event-ID',
                        'in': 'header',
                        'required': False,
                        'schema': {
                            'type': 'string',
                            'pattern': '^[0-9]{1,19}(-[1-9][0-9]{0,8}-[0-9]{1,12})?$',
                        },
                        'description': 'Resume after this event: its id, `<historyId>` or '
                        '`<historyId>-<attempt>-<offset>`.',
                    },
                ],
                'responses': dict(
                    {
                        '200': {
                            'description': 'The stream (text/event-stream).',
                            'content': {'text/event-stream': {'schema': SSE_EVENT}},
                        },
                        '204': {
                            'description': 'Resumed after the last event of a job that has '
                            'ended: nothing more will come.'
                        },
                    },
                    **error_responses(400, 401, 404, 429, 503),
                ),
            }
        },
    }
