"""The live text of running provider calls (docs/architecture.md, decision 15): what a streaming
provider reports through its CallContext goes, coalesced, to a channel (channel.py: a capped
Redis stream per job, or in the process) that the web tier's job streams read.

Each provider call writes into a TextSink. One pump thread per process sends what the sinks
hold: at most one message per call every INTERVAL_S, sooner when MAX_CHARS are waiting, all due
messages of all calls in one round trip. The provider's own thread only appends to a list, so a
slow or absent Redis never slows a call down. A call's first message begins the job's next
text attempt in the same round trip, and the channel gives back its number (a retry, a fallback
or a takeover starts a new one, which the stream announces with ``reset``); its offsets count
characters from the start of that attempt's text. A sink's ``close`` waits (briefly) until its
last text is sent, so the text of a call is in the channel before the job's terminal write
commits.

The text is job output: it is never logged, never written to the database.
"""

import heapq
import itertools
import logging
import threading
import time

from ...core.logs import log_event

INTERVAL_S = 0.1  # at most one message per call this often...
MAX_CHARS = 512  # ...unless this many characters are waiting
CLOSE_WAIT_S = 2.0  # how long a finished call waits for its last text to go out
IDLE_EXIT_S = 30.0  # the pump thread ends after this long with nothing to send


class TextSink:
    """The text of one provider call, as the pump sees it. Its fields belong to the pump and
    change only under the pump's lock."""

    def __init__(self, pump, job_id):
        self.pump = pump
        self.job_id = job_id
        self.attempt = None  # the channel's attempt number, given with the first message
        self.pending = []  # text written and not yet taken into a message
        self.pending_chars = 0
        self.written = 0  # characters written so far
        self.sent = 0  # characters whose message went out (or was dropped by a failed send)
        self.next_at = 0.0  # no message before this monotonic time, unless MAX_CHARS wait
        self.closed = False
        self.entry = None  # its entry in the pump's schedule while it holds pending text
        self.full = False  # in the pump's list of sinks due at once (MAX_CHARS waiting)

    def write(self, text):
        self.pump.write(self, text)

    def close(self):
        self.pump.close(self)


class _Message:
    __slots__ = ('sink', 'offset', 'text')

    def __init__(self, sink, offset, text):
        self.sink, self.offset, self.text = sink, offset, text


class DeltaPump:
    """Coalesces the sinks' text into messages and sends them to ``channel`` (whose
    ``append_many(messages)`` takes (job id, attempt or None to begin one, offset, text) and
    returns the attempt numbers). ``forwarded`` counts the messages sent (the benchmark reads
    it)."""

    def __init__(self, channel, interval_s=INTERVAL_S, max_chars=MAX_CHARS, clock=time.monotonic):
        self.channel = channel
        self.interval_s = interval_s
        self.max_chars = max_chars
        self._clock = clock
        self._cond = threading.Condition()
        # The sinks holding text not yet taken into a message, by when their next message is
        # due: a heap of [next_at, number, sink] entries (an entry whose sink moved on is
        # dropped when it comes up), and the sinks due at once because MAX_CHARS wait.
        # *Why not a scan:* each round looked at every sink with text, thousands with as
        # many streamed calls, most of them not due (8 % of a worker's CPU, issue 34).
        self._schedule = []
        self._full = []
        self._numbers = itertools.count()
        self._thread = None
        self._stopped = False
        self.forwarded = 0

    def open(self, job_id):
        return TextSink(self, job_id)

    def write(self, sink, text):
        with self._cond:
            if sink.closed or self._stopped:
                return
            fresh = not sink.pending
            sink.pending.append(text)
            sink.pending_chars += len(text)
            sink.written += len(text)
            # The pump needs to hear only of a sink it does not wait for yet, or one that is full;
            # otherwise it already sleeps until this sink's next message is due.
            if fresh:
                self._schedule_sink(sink)
                self._cond.notify()
            if sink.pending_chars >= self.max_chars and not sink.full:
                sink.full = True
                self._full.append(sink)
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name='text-pump', daemon=True)
                self._thread.start()

    def _schedule_sink(self, sink):
        """(Under the lock) the sink's next message is due at its ``next_at``."""
        sink.entry = [sink.next_at, next(self._numbers), sink]
        heapq.heappush(self._schedule, sink.entry)

    def close(self, sink):
        """The call is over: its remaining text goes out as its message is due (within
        ``interval_s``); returns once it has, or after CLOSE_WAIT_S (the job's result does not
        wait on a stalled channel)."""
        if sink.written == 0:  # no text (most calls of most job types): nothing to wait for
            sink.closed = True  # written only by the call's own thread, which is this one
            return
        deadline = self._clock() + CLOSE_WAIT_S
        with self._cond:
            sink.closed = True
            if sink.sent >= sink.written or self._thread is None:
                return
            self._cond.notify()
            while sink.sent < sink.written and not self._stopped:
                left = deadline - self._clock()
                if left <= 0:
                    return
                self._cond.wait(left)

    def stop(self):
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _run(self):
        while True:
            with self._cond:
                messages = self._due()
                idle_since = self._clock()
                while not messages:
                    if self._stopped or self._clock() - idle_since > IDLE_EXIT_S:
                        self._thread = None
                        return
                    self._cond.wait(self._sleep_s())
                    messages = self._due()
            self._send(messages)
            with self._cond:
                now = self._clock()
                for message in messages:
                    sink = message.sink
                    # The pace counts from the send, so that a slow round trip never lets two
                    # messages of a call reach the channel closer than ``interval_s``.
                    sink.next_at = now + self.interval_s
                    sink.sent = message.offset + len(message.text)
                    if sink.entry is not None:  # text came during the send: due from now on
                        self._schedule_sink(sink)
                self._cond.notify_all()  # closing sinks wait for their last message

    def _due(self):
        """The messages due now, taken out of their sinks (under the lock)."""
        now = self._clock()
        due, self._full = self._full, []
        while self._schedule and self._schedule[0][0] <= now:
            due.append(heapq.heappop(self._schedule)[2])  # a closing sink keeps the pace too
        messages = []
        for sink in due:
            if sink.entry is None:  # taken already (full, then due) or an entry it moved on from
                continue
            if sink.entry[0] > now and sink.pending_chars < self.max_chars:
                continue  # an old entry of a sink scheduled again for later: it comes up then
            text = ''.join(sink.pending)
            messages.append(_Message(sink, sink.written - len(text), text))
            sink.pending, sink.pending_chars, sink.full, sink.entry = [], 0, False, None
            sink.next_at = now + self.interval_s  # set again once sent
        return messages

    def _sleep_s(self):
        """Until the earliest sink's next message is due (IDLE_EXIT_S with none waiting)."""
        if self._full:
            return 0.001
        while self._schedule and self._schedule[0][2].entry is not self._schedule[0]:
            heapq.heappop(self._schedule)  # an entry whose sink moved on
        if not self._schedule:
            return IDLE_EXIT_S
        return max(0.001, self._schedule[0][0] - self._clock())

    def _send(self, messages):
        """One round trip for all the messages; a call's first message begins the job's next
        text attempt in it (its number comes back). A failure drops these messages (the text
        is only a preview: the job's result is unaffected, and the offsets show a reader the
        gap)."""
        try:
            numbers = self.channel.append_many(
                [(m.sink.job_id, m.sink.attempt, m.offset, m.text) for m in messages]
            )
            for message, number in zip(messages, numbers, strict=True):
                message.sink.attempt = number
            self.forwarded += len(messages)
        except Exception as exc:
            # Never the text, nor the exception's message (it may quote a command's arguments).
            log_event(
                'job.text_send_failed',
                logging.WARNING,
                messages=len(messages),
                error_type=exc.__class__.__name__,
            )
