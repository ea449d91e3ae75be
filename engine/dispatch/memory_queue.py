"""The in-process queue of the embedded default: the same contract as Redis, for one process."""

import collections
import threading
import time

from ..core.registry import QUEUE_NAMES
from .queue import BANDS, Delivery, Message, Queue, band_of


class MemoryQueue(Queue):
    """The same contract inside one process, for the embedded default (``python aijob.py
    serve`` without Redis). Nothing survives a restart, which the reconciler covers: the
    database still says which jobs are queued."""

    def __init__(self):
        self._lock = threading.Condition()
        self._bands = {q: [collections.deque() for _ in range(BANDS)] for q in QUEUE_NAMES}
        self._processing = collections.defaultdict(list)  # (queue, consumer) -> [raw]
        self._markers = {}  # queue job id -> raw
        self._heartbeats = {}  # consumer -> monotonic expiry
        self._cancels = {}  # job id -> monotonic expiry
        self._epoch = 1

    def push(self, message, force=False):
        with self._lock:
            if message.queue_job_id in self._markers and not force:
                return False
            raw = message.encode()
            self._markers[message.queue_job_id] = raw
            self._bands[message.queue_name][band_of(message.priority)].append(raw)
            self._lock.notify_all()  # consumers of both queues share the condition
            return True

    def pop(self, queue_name, consumer_id, timeout_s):
        deliveries = self.pop_many(queue_name, consumer_id, 1, timeout_s)
        return deliveries[0] if deliveries else None

    def pop_many(self, queue_name, consumer_id, limit, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                taken = []
                for band in self._bands[queue_name]:
                    while band and len(taken) < limit:
                        taken.append(band.popleft())
                if taken:
                    self._processing[(queue_name, consumer_id)].extend(taken)
                    return [Delivery(Message.decode(raw), raw, consumer_id) for raw in taken]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._lock.wait(remaining)

    def ack(self, delivery):
        m = delivery.message
        with self._lock:
            self._remove_processing(delivery)
            if self._markers.get(m.queue_job_id) == delivery.raw:
                del self._markers[m.queue_job_id]

    def release(self, delivery):
        m = delivery.message
        with self._lock:
            if self._remove_processing(delivery):
                self._bands[m.queue_name][band_of(m.priority)].appendleft(delivery.raw)
                self._lock.notify_all()

    def heartbeat(self, consumer_id, ttl_ms):
        with self._lock:
            self._heartbeats[consumer_id] = time.monotonic() + ttl_ms / 1000.0

    def recover_orphans(self):
        moved = 0
        now = time.monotonic()
        with self._lock:
            for (queue_name, consumer_id), raws in list(self._processing.items()):
                if self._heartbeats.get(consumer_id, 0) > now:
                    continue
                for raw in reversed(raws):
                    self._bands[queue_name][band_of(Message.decode(raw).priority)].appendleft(raw)
                    moved += 1
                del self._processing[(queue_name, consumer_id)]
            if moved:
                self._lock.notify_all()
        return moved

    def has_entry(self, message):
        with self._lock:
            return message.queue_job_id in self._markers

    def signal_cancel(self, job_id, ttl_s=300):
        with self._lock:
            self._cancels[job_id] = time.monotonic() + ttl_s

    def cancel_signalled(self, job_ids):
        now = time.monotonic()
        with self._lock:
            return {j for j in job_ids if self._cancels.get(j, 0) > now}

    def ping(self):
        return None

    def depth(self, queue_name):
        with self._lock:
            return sum(len(band) for band in self._bands[queue_name])

    def in_flight(self, queue_name):
        with self._lock:
            return sum(len(raws) for (q, _), raws in self._processing.items() if q == queue_name)

    def shard_lengths(self, queue_name):
        return {queue_name: (self.depth(queue_name), self.in_flight(queue_name))}

    def consumers(self):
        now = time.monotonic()
        with self._lock:
            left = {c: int((expiry - now) * 1000) for c, expiry in self._heartbeats.items()}
        return {consumer_id: ms for consumer_id, ms in left.items() if ms > 0}

    def epoch(self):
        with self._lock:
            return self._epoch

    def clear(self):
        """Lose every message (what a Redis restart without persistence does)."""
        with self._lock:
            self._epoch += 1
            for bands in self._bands.values():
                for band in bands:
                    band.clear()
            self._processing.clear()
            self._markers.clear()

    def _remove_processing(self, delivery):
        raws = self._processing.get((delivery.message.queue_name, delivery.consumer_id), [])
        if delivery.raw in raws:
            raws.remove(delivery.raw)
            return True
        return False
