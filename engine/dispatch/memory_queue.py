"""The in-process queue of the embedded default: the same contract as Redis, for one process,
fair per user the same way (a shared list, then the users' turns, in each priority band), with
one running count per user over every queue, as Redis keeps it in the user's shard."""

import collections
import heapq
import itertools
import threading
import time

from ..core.fairness import weights_by_key
from ..core.registry import QUEUE_NAMES
from .queue import BANDS, Delivery, Message, Queue, band_of


class _Rotation:
    """The users with messages waiting, in turn order: the lowest (round, arrival) first. A user
    whose turn ends moves to its next round; a user who arrives joins the round being served
    (``served``: the round of the last message taken), after those already in it. A heap with
    stale entries skipped on the way."""

    def __init__(self):
        self.served = 0
        self._heap = []
        self._entry = {}  # user -> its (round, arrival) in the heap
        self._arrivals = itertools.count()

    def __contains__(self, user):
        return user in self._entry

    def __len__(self):
        return len(self._entry)

    def head(self):
        while self._heap:
            round_, arrival, user = self._heap[0]
            if self._entry.get(user) == (round_, arrival):
                return user
            heapq.heappop(self._heap)  # stale: the user moved or left
        return None

    def join(self, user):
        """A user with a first message waiting: into the round being served."""
        if user not in self._entry:
            self._place(user, self.served)

    def round_of(self, user):
        return self._entry[user][0]

    def next_round(self, user):
        self._place(user, self._entry[user][0] + 1)

    def to_front(self, user):
        """Before the head (a message handed back: its user's turn is given back)."""
        head = self.head()
        if head is None:
            self._place(user, 0)
        elif head != user:
            round_, arrival = self._entry[head]
            self._entry[user] = (round_, arrival - 0.5)
            heapq.heappush(self._heap, (round_, arrival - 0.5, user))

    def leave(self, user):
        self._entry.pop(user, None)

    def _place(self, user, round_):
        self._entry[user] = (round_, next(self._arrivals))
        heapq.heappush(self._heap, self._entry[user] + (user,))


class _Band:
    """One priority band of one queue: the shared list (messages without a user key), each
    user's own list, and the rotation of the users with messages waiting (``turns`` counts the
    head's turns in a row, for weights)."""

    def __init__(self):
        self.shared = collections.deque()
        self.users = {}  # user key -> deque of raw messages, never empty
        self.rotation = _Rotation()
        self.turns = 0

    def __len__(self):
        return len(self.shared) + sum(len(waiting) for waiting in self.users.values())

    def add(self, user, raw, front=False):
        if not user:
            if front:
                self.shared.appendleft(raw)
            else:
                self.shared.append(raw)
            return
        waiting = self.users.setdefault(user, collections.deque())
        if front:  # a message handed back goes first, and its user's turn with it
            waiting.appendleft(raw)
            if self.rotation.head() != user:
                self.rotation.to_front(user)
                self.turns = 0
        else:
            waiting.append(raw)
            self.rotation.join(user)

    def take(self, capped, weight_of):
        """(user key, the next message), ('', None) if none, passing over users for whom
        ``capped(user)``; the user key is '' for a message of the shared list."""
        if self.shared:
            return '', self.shared.popleft()
        for _ in range(len(self.rotation)):
            user = self.rotation.head()
            if capped(user):
                self.rotation.next_round(user)  # its messages stay; the next user's turn
                self.turns = 0
                continue
            waiting = self.users[user]
            raw = waiting.popleft()
            self.rotation.served = self.rotation.round_of(user)
            self.turns += 1
            if not waiting:
                del self.users[user]
                self.rotation.leave(user)
                self.turns = 0
            elif self.turns >= weight_of(user):
                self.rotation.next_round(user)
                self.turns = 0
            return user, raw
        return '', None

    def clear(self):
        self.__init__()


class MemoryQueue(Queue):
    """The same contract inside one process, for the embedded default (``python aijob.py
    serve`` without Redis). Nothing survives a restart, which the reconciler covers: the
    database still says which jobs are queued."""

    def __init__(self, user_weights=None, max_running_per_user=0):
        self._lock = threading.Condition()
        self._bands = {q: [_Band() for _ in range(BANDS)] for q in QUEUE_NAMES}
        self._processing = collections.defaultdict(list)  # (queue, consumer) -> [raw]
        self._running = collections.Counter()  # user key -> messages being processed, any queue
        self._markers = {}  # queue job id -> raw
        self._heartbeats = {}  # consumer -> monotonic expiry
        self._cancels = {}  # job id -> monotonic expiry
        self._cancels_sent = 0  # signal_cancel calls, for cancel_signals_sent
        self._epoch = 1
        self._weights = weights_by_key(user_weights)
        self.max_running_per_user = max_running_per_user

    def push(self, message, force=False):
        with self._lock:
            if message.queue_job_id in self._markers and not force:
                return False
            raw = message.encode()
            self._markers[message.queue_job_id] = raw
            self._band(message).add(message.user_key, raw)
            self._lock.notify_all()  # consumers of both queues share the condition
            return True

    def pop(self, queue_name, consumer_id, timeout_s):
        deliveries = self.pop_many(queue_name, consumer_id, 1, timeout_s)
        return deliveries[0] if deliveries else None

    def pop_many(self, queue_name, consumer_id, limit, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                taken = self._take(queue_name, limit)
                if taken:
                    self._processing[(queue_name, consumer_id)].extend(taken)
                    return [Delivery(Message.decode(raw), raw, consumer_id) for raw in taken]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._lock.wait(remaining)

    def _take(self, queue_name, limit):
        cap = self.max_running_per_user

        def capped(user):
            return cap > 0 and self._running[user] >= cap

        taken = []
        for band in self._bands[queue_name]:
            while len(taken) < limit:
                user, raw = band.take(capped, lambda user: self._weights.get(user, 1))
                if raw is None:
                    break
                taken.append(raw)
                if user:
                    self._running[user] += 1
        return taken

    def ack(self, delivery):
        m = delivery.message
        with self._lock:
            self._remove_processing(delivery)
            if self._markers.get(m.queue_job_id) == delivery.raw:
                del self._markers[m.queue_job_id]

    def release(self, delivery):
        with self._lock:
            if self._remove_processing(delivery):
                self._band(delivery.message).add(delivery.message.user_key, delivery.raw, True)
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
                    message = Message.decode(raw)
                    self._finished(message)
                    self._band(message).add(message.user_key, raw, front=True)
                    moved += 1
                del self._processing[(queue_name, consumer_id)]
            if moved:
                self._lock.notify_all()
        return moved

    def has_entry(self, message):
        with self._lock:
            return message.queue_job_id in self._markers

    def running(self, user_key):
        """Messages of this user being processed, over every queue (what the cap counts)."""
        with self._lock:
            return self._running[user_key]

    def signal_cancel(self, job_id, ttl_s=300):
        with self._lock:
            self._cancels[job_id] = time.monotonic() + ttl_s
            self._cancels_sent += 1

    def cancel_signals_sent(self):
        with self._lock:
            return self._cancels_sent

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
        """One shard, ``0``, as a one-shard Redis names it."""
        return {'0': (self.depth(queue_name), self.in_flight(queue_name))}

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
            self._running.clear()
            self._markers.clear()

    def _band(self, message):
        return self._bands[message.queue_name][band_of(message.priority)]

    def _remove_processing(self, delivery):
        """Take a delivery out of its consumer's list; True if it was there (and then its
        user's running count drops, and a user at the cap may be waited for: wake)."""
        raws = self._processing.get((delivery.message.queue_name, delivery.consumer_id), [])
        if delivery.raw in raws:
            raws.remove(delivery.raw)
            self._finished(delivery.message)
            return True
        return False

    def _finished(self, message):
        key = message.user_key
        if key and self._running[key] > 0:
            self._running[key] -= 1
            if not self._running[key]:
                del self._running[key]
            if self.max_running_per_user:
                # A consumer of any queue may have passed this user over.
                self._lock.notify_all()
