"""The live event stream of one job, ``GET /api/ai/jobs/{id}/stream`` (architecture decision 15):
server-sent events built on the job's history (``ai_job_event``, decision 14), whose increasing
row ids are the events' ids, so ``Last-Event-ID`` resumes exactly after the last event a client
got; and, while the job runs, the text its provider streams (``event: delta``, text_feed.py).

An event id is the stream's position: ``<history id>`` until the client has text, then
``<history id>-<attempt>-<offset>`` (the history row it has last, the text attempt it has and
how many characters of it). Both resume exactly; a plain history id (a client from before
deltas, or one that got none) asks for the current attempt's text from its start.

A fresh stream opens with the job's current status (``event: status``, the JobStatusResponse,
its id the job's latest history row), then sends each history row written after it (``event:
<kind>``: started, progress, retry_scheduled, …) and, once the job is terminal, its final status;
then it ends. A resumed stream sends only what comes after ``Last-Event-ID``; one with nothing
left to send for a terminal job answers 204, which tells an EventSource to stop reconnecting.

A stream waits the way the long poll does (the kernel's http/waiter.py Watch): one loop of the
process reads the latest history id of every streamed job in one query per poll interval and
wakes the streams whose job has a new row; a waiting stream holds no database connection, and
under gevent costs a greenlet, never a thread. Idle streams get a comment every heartbeat
interval; every stream ends after AIJOB_STREAM_MAX_S (the client reconnects with Last-Event-ID).
"""

import json
import logging
import re
import time
from typing import NamedTuple, Optional

from peewee import fn

from ...core.errors import InvalidRequestError
from ...core.history import JobHistory
from ...core.logs import log_event
from ...core.models import AiJobEvent
from ...core.states import TERMINAL
from ...core.status_view import find_for_status, job_status
from ...http.waiter import HISTORY
from . import text_feed

CONTENT_TYPE = 'text/event-stream; charset=utf-8'
RECONNECT_MS = 2000  # the ``retry:`` an EventSource waits before it reconnects
READ_CHUNK = 500  # job ids per batched read of the streams' latest event ids
ROWS_PER_READ = 200  # history rows sent per read of a job's new rows
DONE, MORE, WAIT = 'done', 'more', 'wait'  # what a stream does after sending what it read


# ``<history id>`` or ``<history id>-<attempt>-<offset>``, as the document's pattern says.
EVENT_ID = re.compile(r'([0-9]{1,19})(?:-([1-9][0-9]{0,8})-([0-9]{1,12}))?')
# The largest history id there can be (BIGINT's, SQLite's INTEGER's): 19 digits may say more,
# which no row has and no query may be given (the database would refuse the number).
MAX_HISTORY_ID = 2**63 - 1


class Position(NamedTuple):
    """Where a client is: the last history row it has, and the text attempt and how many
    characters of it it has (``attempt`` None: no text yet)."""

    history_id: int
    attempt: Optional[int] = None
    offset: int = 0

    def event_id(self):
        if self.attempt is None:
            return str(self.history_id)
        return '%d-%d-%d' % self


def parse_last_event_id(raw):
    """The Position a client resumes after (its ``Last-Event-ID`` header), or None for a fresh
    stream. Only ids this service sends are accepted."""
    if raw is None:
        return None
    match = EVENT_ID.fullmatch(raw) if raw.isascii() else None
    if match is None or int(match.group(1)) > MAX_HISTORY_ID:
        raise InvalidRequestError(
            'Last-Event-ID must be the id of an event of this stream', field='Last-Event-ID'
        )
    history_id, attempt, offset = match.groups()
    if attempt is None:
        return Position(int(history_id))
    return Position(int(history_id), int(attempt), int(offset))


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
    lines = [] if event_id is None else ['id: %s' % event_id]
    lines.append('event: %s' % event)
    lines.append('data: %s' % json.dumps(data, separators=(',', ':'), ensure_ascii=False))
    return ('\n'.join(lines) + '\n\n').encode('utf-8')


class JobStream:
    """The body of one stream: an iterable of bytes that the WSGI server sends chunk by chunk.
    ``close()`` (called by the server when the stream ends or the client goes) releases the
    stream's place in the watch and the text feed, whether or not it was ever iterated.

    ``text`` (a text_feed.TextFollower, or None for a job that had ended when the stream opened)
    adds the job's live text: after each read of new history rows, the new text; once the job
    has ended, its last text before its terminal event."""

    def __init__(
        self, store, watch, waiter, position, opening, settings, gone, ended=False, text=None
    ):
        self.store = store
        self.history = JobHistory(store)
        self.watch = watch
        self.waiter = waiter
        self.after_id = position.history_id  # the id of the last history event the client has
        self.opening = opening  # the status message of a fresh stream, or None
        self.ended = ended  # the opening status is final: nothing follows it
        self.text = text
        # The text position of the messages built so far (the follower reads ahead of them);
        # kept in the ids even when no text follows, so that a resumed id stays exact.
        self.attempt, self.offset = position.attempt, position.offset
        self.heartbeat_s, self.max_s, self.check_s = settings
        self.gone = gone  # () -> True once the client has closed its connection
        self.deltas = 0  # delta and reset events sent (the log line counts them)
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
            if self.text is not None:
                self.text.close()

    def position(self):
        """What the client has once it got everything built so far (the next event's id)."""
        return Position(self.after_id, self.attempt, self.offset)

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
            due = {HISTORY, text_feed.TEXT}
            while True:
                chunks, state = self._new_events(due)
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
                due = self.waiter.take()
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
                deltas=self.deltas,
                duration_ms=round((time.monotonic() - started) * 1000),
            )

    def _new_events(self, due):
        """(messages for what changed: ``due`` holds HISTORY, TEXT or both; DONE, MORE or WAIT).
        The history: the job's status is read first: once it is terminal, every row up to its
        terminal change is committed, so the rows read next include them, and the final status
        goes last. The text of a call is in its channel before the call's outcome commits, so
        the text read after a terminal status is the whole of it. New text that starts an
        attempt reads the history first, so that ``started`` or ``retry_scheduled`` precede it
        (the feed usually hears of text before the watch of the row). So the text is taken
        before the history is read, and text that comes while it is read waits for the next
        round (the feed has woken the stream for it): the rows read after a piece of text
        include every row committed before that text was written."""
        pieces = self._text_pieces()
        if HISTORY not in due and all(p[2] == self.attempt for p in pieces):
            return self._messages(pieces), WAIT
        with self.store.connection():
            job, refs = find_for_status(self.waiter.job_id)
            if job is None:
                return [], DONE
            rows = self.history.list(self.waiter.job_id, self.after_id, ROWS_PER_READ)
        terminal = job.lifecycle_status in TERMINAL and len(rows) < ROWS_PER_READ
        chunks = self._messages(pieces + self._text_pieces()) if terminal else []
        for row in rows:
            self.after_id = row.id
            chunks.append(message(row.kind, row.public(), self.position().event_id()))
        if len(rows) == ROWS_PER_READ:
            return chunks + self._messages(pieces), MORE
        if terminal:
            chunks.append(message('status', job_status(job, refs), self.position().event_id()))
            return chunks, DONE
        return chunks + self._messages(pieces), WAIT

    def _text_pieces(self):
        return self.text.events() if self.text is not None else []

    def _messages(self, pieces):
        """The events of text pieces, each id the position once the client has it."""
        chunks = []
        for event, data, attempt, offset in pieces:
            self.attempt, self.offset = attempt, offset
            chunks.append(message(event, data, self.position().event_id()))
        self.deltas += len(chunks)
        return chunks

    def _wait(self, started, last_sent):
        """Until the watch sees a new row or the feed new text ('changed'), a heartbeat is due,
        the stream's time is up ('max_duration'), the client is gone or the server stops."""
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
                return 'changed'
