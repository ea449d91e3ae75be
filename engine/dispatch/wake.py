"""The wake-up timer of deferred jobs (architecture decision 17, *Deferral*): the process that
deferred a job pushes its wake-up message itself at the job's wake time, from one thread for all
its deferred jobs, so a deferral holds no worker thread and wakes within milliseconds of its
time.

The durable wake-up is the outbox event the deferral wrote (claimed by this process): if the
process dies first, its claim expires and the leader's dispatcher pushes the event when it is due
(contracts §4.5); on a graceful stop the claims are handed back at once, still due at their time.
"""

import heapq
import itertools
import logging
import threading
import time

from ..core.logs import log_event

# Pushed this much after the wake time: the deferral's lock_until is the database's clock at
# the write plus the delay, and a message that arrives before it is refused by the lock.
LATE_S = 0.01


class Waker:
    def __init__(self, dispatcher, outbox, claimer, connection):
        self.dispatcher = dispatcher
        self.outbox = outbox
        self.claimer = claimer  # the instance id the deferrals claimed their events with
        self.connection = connection
        self._heap = []  # (monotonic due time, sequence, event)
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread = None
        self._closed = False

    def schedule(self, event, delay_s):
        """Push ``event`` (a claimed wake-up, outbox.create_wake_event) in ``delay_s``."""
        due = time.monotonic() + max(0.0, delay_s) + LATE_S
        with self._cond:
            if self._closed:
                self._release([(due, 0, event)])
                return
            heapq.heappush(self._heap, (due, next(self._order), event))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name='waker', daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self):
        with self._cond:
            return len(self._heap)

    def _run(self):
        while True:
            with self._cond:
                while not self._closed and not self._due():
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                due = []
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            self._push(due)

    def _due(self):
        return bool(self._heap) and self._heap[0][0] <= time.monotonic()

    def _push(self, events):
        """The dispatcher's publish of claimed events: forced pushes, marks batched; a queue
        outage hands them back to the outbox (pending, pushed by the dispatcher later)."""
        try:
            with self.connection():
                self.dispatcher.publish_claimed(events)
        except Exception:  # the store is down too: the claims expire and the dispatcher pushes
            log_event('waker.push_failed', logging.ERROR, exc_info=True, count=len(events))

    def close(self):
        """Stop the timer; the wake-ups not yet due go back to the outbox, due at their time,
        for the leader's dispatcher (this process is stopping)."""
        with self._cond:
            self._closed = True
            left, self._heap = self._heap, []
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(2.0)
        if left:
            self._release(left)

    def _release(self, entries):
        now = time.monotonic()
        try:
            with self.connection():
                for due, _, event in entries:
                    delay_ms = max(0, int((due - now) * 1000))
                    self.outbox.release_batch([event.id], self.claimer, delay_ms)
        except Exception:  # the claims expire instead
            log_event('waker.release_failed', logging.ERROR, exc_info=True, count=len(entries))
