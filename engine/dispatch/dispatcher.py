"""OutboxDispatcher (contracts §4.3–4.5): moves ``ai.job.enqueue`` events from the outbox to the
queues.

Each event is claimed by compare-and-set *before* it is pushed, and a lost claim is skipped, so a
push happens once per claim; the queue's idempotent push covers the crash window of §4.5. The
creating process dispatches its own event right after commit (architecture decision 6); the polling
loop is the safety net. A queue outage hands events back without counting an attempt and backs
off; only real rejections count toward ``dead``.
"""

import logging
import threading
import time

from ..core.errors import QueueUnavailableError
from ..core.logs import log_event
from ..core.outbox import ENQUEUE_EVENT
from .queue import Message


class OutboxDispatcher:
    def __init__(
        self,
        outbox,
        queue,
        instance_id,
        *,
        poll_ms=1000,
        release_ms=30_000,
        lock_ttl_ms=60_000,
        batch_size=100,
        retry_delay_ms=1000,
    ):
        self.outbox = outbox
        self.queue = queue
        self.instance_id = instance_id
        self.poll_ms = poll_ms
        self.release_ms = release_ms
        self.lock_ttl_ms = lock_ttl_ms
        self.batch_size = batch_size
        self.retry_delay_ms = retry_delay_ms
        self._outage_backoff_s = 0.0
        self._next_release = 0.0
        self.wake = threading.Event()

    # ------------------------------------------------------------ one step, for tests
    def cycle(self):
        """One pass of contracts §4.3. Returns how many events were published. Stops early when the
        queue is unreachable (the rest would fail the same way)."""
        published = 0
        for event in self.outbox.find_dispatchable(self.batch_size):
            if not self.outbox.mark_processing(event.id, self.instance_id):
                continue  # another dispatcher claimed it: skip
            outcome = self.publish_claimed(event)
            if outcome == 'outage':
                break
            published += outcome == 'published'
        return published

    def publish_claimed(self, event):
        """Push an event this instance has claimed, then record the outcome: 'published',
        'failed' (a real rejection, counted) or 'outage' (handed back, not counted)."""
        if event.event_type != ENQUEUE_EVENT:
            log_event(
                'outbox.unknown_event_type',
                logging.WARNING,
                event_id=event.id,
                event_type=event.event_type,
            )
            self.outbox.mark_published(event.id, self.instance_id)
            return 'published'
        try:
            message = message_for(event.payload)
        except (KeyError, TypeError, ValueError) as exc:
            self.outbox.mark_failed(
                event.id,
                self.instance_id,
                'DISPATCH_FAILED: bad payload (%s)' % exc.__class__.__name__,
                self.retry_delay_ms,
            )
            return 'failed'
        try:
            self.queue.push(message)
        except QueueUnavailableError as exc:
            self._outage_backoff_s = min(30.0, max(0.5, self._outage_backoff_s * 2))
            self.outbox.release(event.id, self.instance_id, int(self._outage_backoff_s * 1000))
            log_event(
                'queue.unavailable',
                logging.WARNING,
                component='dispatcher',
                event_id=event.id,
                retry_in_s=round(self._outage_backoff_s, 1),
                error=str(exc),
            )
            return 'outage'
        self._outage_backoff_s = 0.0
        self.outbox.mark_published(event.id, self.instance_id)
        return 'published'

    def release_expired(self):
        """Release claims of dispatchers that died between claim and push (contracts §4.5)."""
        released = self.outbox.release_expired_locks(self.lock_ttl_ms)
        if released:
            log_event('outbox.claims_released', count=released)
        return released

    # ------------------------------------------------------------ the thread
    def run(self, stop, connection):
        """Loop until ``stop`` is set: release expired claims every ``release_ms``, dispatch
        every ``poll_ms`` (sooner when woken), backing off while the queue is down."""
        while not stop.is_set():
            try:
                with connection():
                    if time.monotonic() >= self._next_release:
                        self.release_expired()
                        self._next_release = time.monotonic() + self.release_ms / 1000.0
                    self.cycle()
            except Exception:  # a store outage: log, wait, go on
                log_event('dispatcher.cycle_failed', logging.ERROR, exc_info=True)
            wait = max(self.poll_ms / 1000.0, self._outage_backoff_s)
            self.wake.wait(wait)
            self.wake.clear()


def message_for(payload):
    return Message.for_job(
        payload['jobId'], payload['jobType'], payload['queueName'], payload['priority']
    )
