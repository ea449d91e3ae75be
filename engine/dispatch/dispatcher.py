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
from ..core.fairness import user_key
from ..core.logs import log_event
from ..core.models import AiJob
from ..core.outbox import ENQUEUE_EVENT, WAKE_EVENT
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
        store_connection=None,
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
        self._claims = 0
        self.wake = threading.Event()
        # Marks of events pushed right after their create, written in batches.
        self.marks = PublishMarks(outbox, instance_id, store_connection)

    # ------------------------------------------------------------ one step, for tests
    def cycle(self):
        """One pass of contracts §4.3 over up to ``batch_size`` due events: one CAS claim for
        all of them, one pipeline of pushes, one update marking them published. Returns how
        many were published."""
        self._claims += 1
        claimer = '%s#%d' % (self.instance_id, self._claims)  # names exactly this claim
        events = self.outbox.claim_batch(claimer, self.batch_size)
        return self.publish(events, claimer) if events else 0

    def publish_claimed(self, events):
        """Push events this instance claimed in a create transaction (architecture decision 6)
        at once, together; their marks as published join the next batch of marks."""
        return self.publish(events, self.instance_id, defer_marks=True)

    def publish(self, events, claimer, defer_marks=False):
        """Push events that ``claimer`` holds and record the outcome: published; a real
        rejection (a bad payload) counted toward dead; or, when the queue is unreachable, every
        event handed back uncounted. Returns how many were published."""
        published, sendable = [], []
        known_users = user_keys_missing_from(events)
        for event in events:
            if event.event_type not in (ENQUEUE_EVENT, WAKE_EVENT):
                log_event(
                    'outbox.unknown_event_type',
                    logging.WARNING,
                    event_id=event.id,
                    event_type=event.event_type,
                )
                published.append(event.id)  # nothing to push: done with it
                continue
            try:
                message = message_for(event.payload, known_users)
                sendable.append((event.id, message, event.event_type))
            except (KeyError, TypeError, ValueError) as exc:
                reason = 'DISPATCH_FAILED: bad payload (%s)' % exc.__class__.__name__
                self.outbox.mark_failed(event.id, claimer, reason, self.retry_delay_ms)
        if sendable:
            try:
                self._push(sendable)
            except QueueUnavailableError as exc:
                self._hand_back([event_id for event_id, _, _ in sendable], claimer, exc)
                sendable = []
            else:
                self._outage_backoff_s = 0.0
        published.extend(event_id for event_id, _, _ in sendable)
        if defer_marks:
            self.marks.add(published)
        else:
            self.outbox.mark_published_batch(published, claimer)
        return len(published)

    def _push(self, sendable):
        """The enqueue events' messages in one round trip; each wake-up (a deferred job's) on
        its own and forced: the message the deferring worker popped may still look live (its
        ack follows the deferral's commit), and that must not swallow the wake-up."""
        enqueues = [message for _, message, kind in sendable if kind == ENQUEUE_EVENT]
        if enqueues:
            self.queue.push_many(enqueues)
        for _, message, kind in sendable:
            if kind == WAKE_EVENT:
                self.queue.push(message, force=True)

    def _hand_back(self, event_ids, claimer, exc):
        """The queue is down: release the claims (no attempt counted) and back off. Pushes that
        did get through before the failure are harmless to repeat: the push is idempotent."""
        self._outage_backoff_s = min(30.0, max(0.5, self._outage_backoff_s * 2))
        self.outbox.release_batch(event_ids, claimer, int(self._outage_backoff_s * 1000))
        log_event(
            'queue.unavailable',
            logging.WARNING,
            component='dispatcher',
            events=len(event_ids),
            retry_in_s=round(self._outage_backoff_s, 1),
            error=str(exc),
        )

    def release_expired(self):
        """Release claims of dispatchers that died between claim and push (contracts §4.5)."""
        released = self.outbox.release_expired_locks(self.lock_ttl_ms)
        if released:
            log_event('outbox.claims_released', count=released)
        return released

    # ------------------------------------------------------------ the thread
    def run(self, stop, connection, active=None):
        """Loop until ``stop`` is set: release expired claims every ``release_ms``, dispatch
        every ``poll_ms`` (sooner when woken), backing off while the queue is down. Only while
        ``active()`` says so (the housekeeping leader, architecture decision 12): elsewhere the
        eager dispatch after each create is all this process publishes."""
        while not stop.is_set():
            try:
                if active is None or active():
                    self._poll(stop, connection)
            except Exception:  # a store outage: log, wait, go on
                log_event('dispatcher.cycle_failed', logging.ERROR, exc_info=True)
            wait = max(self.poll_ms / 1000.0, self._outage_backoff_s)
            self.wake.wait(wait)
            self.wake.clear()

    def _poll(self, stop, connection):
        with connection():
            if time.monotonic() >= self._next_release:
                self.release_expired()
                self._next_release = time.monotonic() + self.release_ms / 1000.0
            while self.cycle() == self.batch_size and not stop.is_set():
                pass  # a full batch: there may be more due right now


def message_for(payload, known_users=None):
    """The queue message of an enqueue or wake-up event, with its user's key: the payload's,
    else ``known_users``' (user_keys_missing_from), else none (the message waits in its band's
    shared list, taken before the users' turns)."""
    job_id = payload['jobId']
    return Message.for_job(
        job_id,
        payload['jobType'],
        payload['queueName'],
        payload['priority'],
        payload.get('userKey') or (known_users or {}).get(job_id, ''),
    )


def user_keys_missing_from(events):
    """{job id: user key} of the events whose payload names no user key (written before fair
    queues, or by a writer that does not know the job's user: a provider batch's wake-up), read
    from their jobs' rows in one query, so their messages take their users' turns and count
    toward the running cap. No query when every event has its key (a create's, a deferral's)."""
    missing = [
        e.payload['jobId']
        for e in events
        if isinstance(e.payload, dict) and e.payload.get('jobId') and not e.payload.get('userKey')
    ]
    if not missing:
        return {}
    rows = AiJob.select(AiJob.id, AiJob.user_id).where(AiJob.id.in_(missing)).tuples()
    return {job_id: user_key(user_id) for job_id, user_id in rows}


class PublishMarks:
    """The "published" marks of events pushed right after their create: one UPDATE for many,
    written by a small thread at most ``interval_s`` later (or at once when ``batch_size`` are
    waiting). Until then an event stays claimed by this instance; if the process dies first the
    claim expires and the event is pushed again, which the idempotent push and the lock CAS make
    harmless."""

    def __init__(self, outbox, claimer, connection, interval_s=1.0, batch_size=1000):
        self.outbox = outbox
        self.claimer = claimer
        self.connection = connection
        self.interval_s = interval_s
        self.batch_size = batch_size
        self._pending = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._closed = False

    def add(self, event_ids):
        if not event_ids:
            return
        with self._lock:
            self._pending.extend(event_ids)
            full = len(self._pending) >= self.batch_size
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name='publish-marks', daemon=True)
                self._thread.start()
        if full:
            self._wake.set()

    def flush(self):
        """Write every pending mark now (on this thread's connection); returns how many."""
        with self._lock:
            ids, self._pending = self._pending, []
        for start in range(0, len(ids), self.batch_size):
            try:
                self.outbox.mark_published_batch(ids[start : start + self.batch_size], self.claimer)
            except Exception:
                with self._lock:  # keep what was not written for the next flush
                    self._pending[:0] = ids[start:]
                raise
        return len(ids)

    def close(self):
        """Stop the thread after a last flush."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        elif self._pending:
            with self.connection():
                self.flush()

    def _run(self):
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                with self.connection():
                    self.flush()
            except Exception:  # a store outage: the claims stay, and expire if it lasts
                log_event('outbox.publish_marks_failed', logging.ERROR, exc_info=True)
            if self._closed and not self._pending:
                return
