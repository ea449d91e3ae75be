"""The live event stream of one job, ``GET /api/ai/jobs/{id}/stream`` (architecture decision 15):
server-sent events built on the job's history (``ai_job_event``, decision 14), whose increasing
row ids are the events' ids, so ``Last-Event-ID`` resumes exactly after the last event a client
got.

A fresh stream opens with the job's current status (``event: status``, the JobStatusResponse,
its id the job's latest history row), then sends each history row written after it (``event:
<kind>``: started, progress, retry_scheduled, …) and, once the job is terminal, its final status;
then it ends. A resumed stream sends only what comes after ``Last-Event-ID``; one with nothing
left to send for a terminal job answers 204, which tells an EventSource to stop reconnecting.

A stream waits the way the long poll does (app.Watch): one loop of the process reads the latest
history id of every streamed job in one query per poll interval and wakes the streams whose job
has a new row; a waiting stream holds no database connection, and under gevent costs a greenlet,
never a thread. Idle streams get a comment every heartbeat interval; every stream ends after
AIJOB_STREAM_MAX_S (the client reconnects with Last-Event-ID).
"""

import json
import logging
import time

from peewee import fn

from ..core.errors import InvalidRequestError
from ..core.history import JobHistory
from ..core.lifecycle import TERMINAL
from ..core.logs import log_event
from ..core.models import AiJobEvent
from ..core.status_view import find_for_status, job_status

CONTENT_TYPE = 'text/event-stream; charset=utf-8'
RECONNECT_MS = 2000  # the ``retry:`` an EventSource waits before it reconnects
READ_CHUNK = 500  # job ids per batched read of the streams' latest event ids
ROWS_PER_READ = 200  # history rows sent per read of a job's new rows
DONE, MORE, WAIT = 'done', 'more', 'wait'  # what a stream does after sending what it read


def parse_last_event_id(raw):
    """The id a client resumes after (its ``Last-Event-ID`` header), or None for a fresh
    stream. Only ids this service sent are accepted: whole numbers."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:  # as the document's pattern
        raise InvalidRequestError(
            'Last-Event-ID must be the id of an event of this stream', field='Last-Event-ID'
        )
    return int(raw)


def latest_event_ids(job_ids):
    """{job id: its latest history row id} for the jobs that have one, on the caller's
    connection (one query per READ_CHUNK jobs, on the (job_id, id) index)."""
    latest = {}
    for start in range(0, len(job_ids), READ_CHUNK):
        chunk = job_ids[start : start + READ_CHUNK]
        query = (
            AiJobEvent.select(AiJobEvent.job_id, fn.MAX(AiJobEvent.id))
            .where(AiJobEvent.job_id.in_(chunk))
            .group_by(AiJobEvent.job_id)
            .tuples()
        )
        latest.update(query)
    return latest


def watch_reader(store):
    """What the streams' watch reads each poll: the latest history id of every watched job."""

    def read(job_ids):
        with store.connection():
            return latest_event_ids(job_ids)

    return read


def message(event, data, event_id=None):
    """One server-sent event (JSON data on one line, so no ``data:`` continuation is needed)."""
    lines = [] if event_id is None else ['id: %d' % event_id]
    lines.append('event: %s' % event)
    lines.append('data: %s' % json.dumps(data, separators=(',', ':'), ensure_ascii=False))
    return ('\n'.join(lines) + '\n\n').encode('utf-8')


class JobStream:
    """The body of one stream: an iterable of bytes that the WSGI server sends chunk by chunk.
    ``close()`` (called by the server when the stream ends or the client goes) releases the
    stream's place in the watch, whether or not it was ever iterated."""

    def __init__(self, store, watch, waiter, after_id, opening, settings, gone, ended=False):
        self.store = store
        self.history = JobHistory(store)
        self.watch = watch
        self.waiter = waiter
        self.after_id = after_id  # the id of the last event the client has
        self.opening = opening  # the status message of a fresh stream, or None
        self.ended = ended  # the opening status is final: nothing follows it
        self.heartbeat_s, self.max_s, self.check_s = settings
        self.gone = gone  # () -> True once the client has closed its connection
        self._left = False
        self._events = self._run()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._events)

    def close(self):
        self._events.close()
        if not self._left:
            self._left = True
            self.watch.leave(self.waiter)

    def _run(self):
        job_id = self.waiter.job_id
        started = time.monotonic()
        sent, reason = 0, 'client_gone'
        try:
            yield ('retry: %d\n\n' % RECONNECT_MS).encode('ascii')
            if self.opening is not None:
                yield self.opening
                sent += 1
                if self.ended:
                    reason = 'terminal'
                    return
            last_sent = time.monotonic()
            while True:
                chunks, state = self._new_events()
                for chunk in chunks:
                    yield chunk
                    sent += 1
                if chunks:
                    last_sent = time.monotonic()
                if state == DONE:
                    reason = 'terminal'
                    return
                if state == MORE:
                    continue  # a long history: read on at once, the watch has seen it all
                reason = self._wait(started, last_sent)
                while reason == 'heartbeat':  # nothing to read: only the comment goes out
                    yield b': keepalive\n\n'
                    last_sent = time.monotonic()
                    reason = self._wait(started, last_sent)
                if reason != 'changed':
                    return
        except GeneratorExit:  # the server closed the stream: its client went away
            reason = 'client_gone'
            raise
        except Exception:  # the store went away mid-stream: end it; the client resumes later
            reason = 'store_unavailable'
            log_event('http.stream_failed', logging.WARNING, exc_info=True, job_id=job_id)
        finally:
            log_event(
                'http.stream_ended',
                job_id=job_id,
                user_id=self.waiter.user_id,
                reason=reason,
                events=sent,
                duration_ms=round((time.monotonic() - started) * 1000),
            )

    def _new_events(self):
        """(messages for the history rows after ``after_id``, DONE, MORE or WAIT). The job's
        status is read first: once it is terminal, every row up to its terminal change is
        committed, so the rows read next include them, and the final status goes last."""
        with self.store.connection():
            job, refs = find_for_status(self.waiter.job_id)
            if job is None:
                return [], DONE
            rows = self.history.list(self.waiter.job_id, self.after_id, ROWS_PER_READ)
        chunks = [message(row.kind, row.public(), row.id) for row in rows]
        if rows:
            self.after_id = rows[-1].id
        if len(rows) == ROWS_PER_READ:
            return chunks, MORE
        if job.lifecycle_status in TERMINAL:
            chunks.append(message('status', job_status(job, refs), self.after_id))
            return chunks, DONE
        return chunks, WAIT

    def _wait(self, started, last_sent):
        """Until the watch sees a new row ('changed'), a heartbeat is due, the stream's time is
        up ('max_duration'), the client is gone or the server stops."""
        while True:
            now = time.monotonic()
            until_end = self.max_s - (now - started)
            until_beat = self.heartbeat_s - (now - last_sent)
            if until_end <= 0:
                return 'max_duration'
            if until_beat <= 0:
                return 'heartbeat'
            woken = self.waiter.changed.wait(min(self.check_s, until_end, until_beat))
            if self.gone():
                return 'client_gone'
            if self.watch.stopping():
                return 'server_stopping'
            if woken:
                self.waiter.changed.clear()
                return 'changed'
