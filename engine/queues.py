"""Queues (ADR §3): a small contract, a reliable Redis-list backend and an in-process one.

The database stays the source of truth (DESIGN decision 1): a queue only wakes a worker up, and a
duplicate message is harmless because ``lock_job`` is a compare-and-set. What a queue must not do
is lose a message when a consumer dies: a pop moves the message atomically into the consumer's
processing list, an ack removes it, and the processing list of a consumer whose heartbeat expired
is moved back (DESIGN decision 5).

Priority is honoured in three bands (0–32, 33–65, 66–100), each FIFO; lower numbers first.
"""
import collections
import json
import threading
import time
from dataclasses import dataclass

import redis

from .errors import QueueUnavailableError
from .registry import QUEUE_NAMES

BANDS = 3


def band_of(priority):
    return min(BANDS - 1, max(0, int(priority)) * BANDS // 101)


def queue_job_id(queue_name, job_type, job_id):
    """ADR §3.2's ``{queueName}:{jobType}:{idempotencyKey}``. The job id stands in for the key:
    idempotency keys are scoped per user, so two users' keys could collide here, while the job
    id is exactly what a key resolves to."""
    return '%s:%s:%s' % (queue_name, job_type, job_id)


@dataclass(frozen=True)
class Message:
    """ADR §3.2's payload plus routing; ids only, never input, user or credential."""
    job_id: str
    job_type: str
    queue_name: str
    priority: int
    created_at: float

    @property
    def queue_job_id(self):
        return queue_job_id(self.queue_name, self.job_type, self.job_id)

    def encode(self):
        return json.dumps({'jobId': self.job_id, 'jobType': self.job_type,
                           'queueName': self.queue_name, 'priority': self.priority,
                           'idempotencyKey': self.queue_job_id, 'createdAt': self.created_at},
                          separators=(',', ':'), sort_keys=True)

    @classmethod
    def decode(cls, raw):
        data = json.loads(raw)
        return cls(data['jobId'], data['jobType'], data['queueName'], int(data['priority']),
                   float(data['createdAt']))

    @classmethod
    def for_job(cls, job_id, job_type, queue_name, priority):
        if queue_name not in QUEUE_NAMES:
            raise ValueError('unknown queue %r' % (queue_name,))
        return cls(job_id, job_type, queue_name, int(priority), time.time())


@dataclass(frozen=True)
class Delivery:
    """A message popped by a consumer; pass it back to ``ack`` or ``release``."""
    message: Message
    raw: str
    consumer_id: str


class Queue:
    """The contract every backend implements."""

    def push(self, message, force=False):
        """Enqueue unless a message with the same queue job id is already live (SET NX, like
        BullMQ's jobId). ``force`` pushes anyway (a takeover after a lost worker). Returns
        whether it pushed."""
        raise NotImplementedError

    def pop(self, queue_name, consumer_id, timeout_s):
        """Move the most urgent message into the consumer's processing list and return its
        Delivery, waiting up to ``timeout_s``; None if nothing came."""
        raise NotImplementedError

    def ack(self, delivery):
        """Done with a delivery: remove it from processing and forget its queue job id."""
        raise NotImplementedError

    def release(self, delivery):
        """Hand a delivery back to the front of its queue (graceful shutdown)."""
        raise NotImplementedError

    def heartbeat(self, consumer_id, ttl_ms):
        """Consumer ``consumer_id`` is alive for ``ttl_ms`` more."""
        raise NotImplementedError

    def recover_orphans(self):
        """Move back the processing lists of consumers whose heartbeat expired; return how many
        messages moved."""
        raise NotImplementedError

    def has_entry(self, message):
        """Is a message for this job live (queued or being processed)?"""
        raise NotImplementedError

    def signal_cancel(self, job_id, ttl_s=300):
        """The fast cancellation path (``job:cancel:{jobId}``, ADR §8.2)."""
        raise NotImplementedError

    def cancel_signalled(self, job_ids):
        """The subset of ``job_ids`` with a live cancel signal."""
        raise NotImplementedError

    def ping(self):
        """Raise QueueUnavailableError unless the backend answers."""
        raise NotImplementedError

    def close(self):
        pass


# ---------------------------------------------------------------- Redis
def _translate(method):
    """Driver errors stop at this edge (STYLE: dramatiq)."""
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except redis.RedisError as exc:
            raise QueueUnavailableError('redis: %s' % exc.__class__.__name__) from None
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


# KEYS: marker, band, wake. ARGV: message, marker TTL, force.
_PUSH = """
if ARGV[3] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, 63)
return 1
"""

# KEYS: bands (most urgent first)..., processing, consumers. ARGV: consumer id. Registers the
# consumer (for orphan recovery) in the same round trip; LMOVE in a script is as atomic as BLMOVE.
_POP = """
redis.call('SADD', KEYS[#KEYS], ARGV[1])
for i = 1, #KEYS - 2 do
  local raw = redis.call('LMOVE', KEYS[i], KEYS[#KEYS - 1], 'LEFT', 'RIGHT')
  if raw then return raw end
end
return false
"""

_ACK = """
redis.call('LREM', KEYS[1], 1, ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""

_RELEASE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, 63)
end
return 1
"""

# KEYS: processing, bands..., wake. Moves every message back to the front of its band.
_RECOVER = """
local moved = 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local priority = tonumber(cjson.decode(raw)['priority']) or 50
  local band = math.min(#KEYS - 3, math.floor(math.max(0, priority) * (#KEYS - 2) / 101))
  redis.call('LPUSH', KEYS[2 + band], raw)
  redis.call('LPUSH', KEYS[#KEYS], '1')
  moved = moved + 1
end
redis.call('LTRIM', KEYS[#KEYS], 0, 63)
return moved
"""

MARKER_TTL_S = 7 * 24 * 3600


class RedisQueue(Queue):
    """Redis lists. Every key starts with one prefix and, per queue, a hash tag
    (``aijob:{ai-interactive}:…``) so a queue's keys share a Redis Cluster slot."""

    def __init__(self, url, prefix='aijob'):
        self.prefix = prefix
        self.redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=3,
                                          decode_responses=True, health_check_interval=30)
        self._push = self.redis.register_script(_PUSH)
        self._pop = self.redis.register_script(_POP)
        self._ack = self.redis.register_script(_ACK)
        self._release = self.redis.register_script(_RELEASE)
        self._recover = self.redis.register_script(_RECOVER)

    # -- keys
    def _key(self, queue_name, *parts):
        return ':'.join((self.prefix, '{%s}' % queue_name) + parts)

    def _bands(self, queue_name):
        return [self._key(queue_name, 'band', str(b)) for b in range(BANDS)]

    def _processing(self, queue_name, consumer_id):
        return self._key(queue_name, 'processing', consumer_id)

    def _marker(self, message):
        return self._key(message.queue_name, 'job', message.queue_job_id)

    def heartbeat_key(self, consumer_id):
        return '%s:worker:heartbeat:%s' % (self.prefix, consumer_id)

    def cancel_key(self, job_id):
        return '%s:job:cancel:%s' % (self.prefix, job_id)

    # -- contract
    @_translate
    def push(self, message, force=False):
        q = message.queue_name
        keys = [self._marker(message), self._bands(q)[band_of(message.priority)], self._key(q, 'wake')]
        return bool(self._push(keys=keys, args=[message.encode(), MARKER_TTL_S, '1' if force else '0']))

    @_translate
    def pop(self, queue_name, consumer_id, timeout_s):
        keys = self._bands(queue_name) + [self._processing(queue_name, consumer_id),
                                          self._key(queue_name, 'consumers')]
        deadline = time.monotonic() + timeout_s
        while True:
            raw = self._pop(keys=keys, args=[consumer_id])
            if raw:
                return Delivery(Message.decode(raw), raw, consumer_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Sleep until a push wakes us (BLPOP on the queue's wake list), then pop for real.
            self.redis.blpop([self._key(queue_name, 'wake')], timeout=max(0.01, min(remaining, 5)))

    @_translate
    def ack(self, delivery):
        q = delivery.message.queue_name
        self._ack(keys=[self._processing(q, delivery.consumer_id), self._marker(delivery.message)],
                  args=[delivery.raw])

    @_translate
    def release(self, delivery):
        m = delivery.message
        self._release(keys=[self._processing(m.queue_name, delivery.consumer_id),
                            self._bands(m.queue_name)[band_of(m.priority)],
                            self._key(m.queue_name, 'wake')], args=[delivery.raw])

    @_translate
    def heartbeat(self, consumer_id, ttl_ms):
        self.redis.set(self.heartbeat_key(consumer_id), '1', px=int(ttl_ms))

    @_translate
    def recover_orphans(self):
        moved = 0
        for queue_name in QUEUE_NAMES:
            consumers_key = self._key(queue_name, 'consumers')
            for consumer_id in self.redis.smembers(consumers_key):
                if self.redis.exists(self.heartbeat_key(consumer_id)):
                    continue
                keys = [self._processing(queue_name, consumer_id)] + self._bands(queue_name) \
                    + [self._key(queue_name, 'wake')]
                moved += int(self._recover(keys=keys))
                self.redis.srem(consumers_key, consumer_id)
        return moved

    @_translate
    def has_entry(self, message):
        return bool(self.redis.exists(self._marker(message)))

    @_translate
    def signal_cancel(self, job_id, ttl_s=300):
        self.redis.set(self.cancel_key(job_id), '1', ex=ttl_s)

    @_translate
    def cancel_signalled(self, job_ids):
        job_ids = list(job_ids)
        if not job_ids:
            return set()
        flags = self.redis.mget([self.cancel_key(j) for j in job_ids])
        return {job_id for job_id, flag in zip(job_ids, flags) if flag}

    @_translate
    def ping(self):
        self.redis.ping()

    @_translate
    def depth(self, queue_name):
        """Messages waiting (not being processed) in a queue."""
        return sum(self.redis.llen(key) for key in self._bands(queue_name))

    def close(self):
        self.redis.close()


# ---------------------------------------------------------------- in-process
class MemoryQueue(Queue):
    """The same contract inside one process, for the embedded default (``python aijob.py
    serve`` without Redis). Nothing survives a restart, which the reconciler covers: the
    database still says which jobs are queued."""

    def __init__(self):
        self._lock = threading.Condition()
        self._bands = {q: [collections.deque() for _ in range(BANDS)] for q in QUEUE_NAMES}
        self._processing = collections.defaultdict(list)     # (queue, consumer) -> [raw]
        self._markers = {}                                    # queue job id -> raw
        self._heartbeats = {}                                 # consumer -> monotonic expiry
        self._cancels = {}                                    # job id -> monotonic expiry

    def push(self, message, force=False):
        with self._lock:
            if message.queue_job_id in self._markers and not force:
                return False
            raw = message.encode()
            self._markers[message.queue_job_id] = raw
            self._bands[message.queue_name][band_of(message.priority)].append(raw)
            self._lock.notify_all()      # consumers of both queues share the condition
            return True

    def pop(self, queue_name, consumer_id, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                for band in self._bands[queue_name]:
                    if band:
                        raw = band.popleft()
                        self._processing[(queue_name, consumer_id)].append(raw)
                        return Delivery(Message.decode(raw), raw, consumer_id)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
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

    def clear(self):
        """Lose every message (what a Redis restart without persistence does)."""
        with self._lock:
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


def open_queue(config):
    """RedisQueue when AIJOB_REDIS_URL is set, else the in-process MemoryQueue."""
    if config.redis_url:
        return RedisQueue(config.redis_url, prefix=config.redis_prefix)
    return MemoryQueue()
