"""The live text of the jobs a web process streams (docs/architecture.md, decision 15): one loop
per process waits on the text channel (channel.py) for every followed job at once (one
XREAD, blocking briefly, on Redis) and wakes the streams whose job has new text; each stream then
reads its job's new entries itself and turns them into ``delta`` and ``reset`` events
(TextFollower), skipping what its client already has.

A waiting stream holds no connection of its own, and under gevent the loop is a greenlet whose
every wait is bounded (WAIT_S). The text is job output: it is never logged.
"""

import logging
import threading
import time

from ...core.errors import AiJobError
from ...core.logs import log_event
from .channel import RESET

WAIT_S = 0.2  # longest one wait of the loop: a newly followed job joins the next one
RETRY_S = 1.0  # after a failed wait (Redis away): the streams go on with their status events
TEXT = 'text'  # what the feed wakes a stream with (Waiter.due), besides the watch's HISTORY


class TextFeed:
    """The followed jobs of this process and the loop that waits on their text."""

    def __init__(self, channel, wait_s=WAIT_S):
        self.channel = channel
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._by_job = {}  # job id -> set of waiters
        self._cursors = {}  # job id -> the channel's id of the last entry the loop saw
        self._loop = None

    def follow(self, waiter, cursor):
        """Wake ``waiter`` on new text of its job after ``cursor`` (the last entry it read)."""
        with self._lock:
            job_id = waiter.job_id
            if job_id not in self._cursors:
                self._cursors[job_id] = cursor
            elif self._cursors[job_id] != cursor:
                waiter.wake(TEXT)  # the loop may have seen entries this stream has not read
            self._by_job.setdefault(job_id, set()).add(waiter)
            if self._loop is None:
                self._loop = threading.Thread(target=self._run, name='text-feed', daemon=True)
                self._loop.start()

    def unfollow(self, waiter):
        with self._lock:
            waiters = self._by_job.get(waiter.job_id, set())
            waiters.discard(waiter)
            if not waiters:
                self._by_job.pop(waiter.job_id, None)
                self._cursors.pop(waiter.job_id, None)

    def _run(self):
        while True:
            with self._lock:
                cursors = dict(self._cursors)
                if not cursors:
                    self._loop = None
                    return
            try:
                found = self.channel.wait_new(cursors, self.wait_s)
            except Exception as exc:  # Redis away, or its client closed under the wait
                log_event(
                    'http.text_feed_failed',
                    logging.WARNING,
                    jobs=len(cursors),
                    error_type=exc.__class__.__name__,
                )
                time.sleep(RETRY_S)
                continue
            with self._lock:
                for job_id, last in found.items():
                    if job_id in self._cursors:
                        self._cursors[job_id] = last
                        for waiter in self._by_job[job_id]:
                            waiter.wake(TEXT)


class TextFollower:
    """What one stream's client has of its job's text, ``attempt`` and ``offset`` (from its
    Last-Event-ID, or nothing yet), and the events for what it has not. The first read takes the
    whole channel of the job, then the stream follows it through the feed."""

    def __init__(self, channel, feed, waiter, attempt=None, offset=0):
        self.channel = channel
        self.feed = feed
        self.waiter = waiter
        self.attempt = attempt
        self.offset = offset
        self.cursor = None  # the channel's id of the last entry read
        self.following = False

    def events(self):
        """[(event name, data, attempt, offset)] for the text the client does not have yet, in
        order; ``attempt`` and ``offset`` are what the client has once it got that event."""
        try:
            entries = self.channel.read(self.waiter.job_id, self.cursor)
        except AiJobError:
            entries = []  # Redis away: the next wake (or the job's end) reads again
        if entries:
            self.cursor = entries[-1].id
        if not self.following:
            self.feed.follow(self.waiter, self.cursor)
            self.following = True
        return self._pieces(entries)

    def close(self):
        if self.following:
            self.following = False
            self.feed.unfollow(self.waiter)

    def _pieces(self, entries):
        # A client with no text yet starts at the latest attempt: earlier ones were replaced.
        latest = max((e.attempt for e in entries), default=0) if self.attempt is None else 0
        pieces = []
        for entry in entries:
            if entry.attempt < (self.attempt or latest):
                continue  # an attempt the client has left behind
            if self.attempt is not None and entry.attempt > self.attempt:
                # A new attempt (its reset entry, or its first text when the reset was trimmed):
                # the client drops the text it has.
                self.attempt, self.offset = entry.attempt, 0
                pieces.append(('reset', {'attempt': entry.attempt}, self.attempt, 0))
            if entry.kind == RESET:
                continue
            if self.attempt is None:
                self.attempt, self.offset = entry.attempt, 0
            end = entry.offset + len(entry.text)
            if end <= self.offset:
                continue  # the client has it
            skip = max(0, self.offset - entry.offset)
            data = {'attempt': entry.attempt, 'offset': entry.offset + skip}
            data['text'] = entry.text[skip:]
            self.offset = end
            pieces.append(('delta', data, self.attempt, end))
        return pieces
