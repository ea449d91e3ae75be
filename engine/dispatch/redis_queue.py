"""The Redis-list queue: reliable pops into a per-consumer processing list, priority bands, an
idempotent push, orphan recovery and the cancel fast path, each an atomic Lua script.

Every key is ``{prefix}:{queue}:…`` with the queue as hash tag, so each script's keys share one
slot (architecture decision 5). Redis errors stop at this edge as QueueUnavailableError.
"""

import os
import time

import redis

from ..core.errors import QueueUnavailableError
from ..core.registry import QUEUE_NAMES
from .queue import BANDS, Delivery, Message, Queue, band_of


def _translate(method):
    """Driver errors stop at this edge (as dramatiq does)."""

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
        self.redis = redis.Redis.from_url(
            url,
            socket_timeout=10,
            socket_connect_timeout=3,
            decode_responses=True,
            health_check_interval=30,
        )
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
    def _push_keys(self, message):
        q = message.queue_name
        return [
            self._marker(message),
            self._bands(q)[band_of(message.priority)],
            self._key(q, 'wake'),
        ]

    @_translate
    def push(self, message, force=False):
        args = [message.encode(), MARKER_TTL_S, '1' if force else '0']
        return bool(self._push(keys=self._push_keys(message), args=args))

    @_translate
    def push_many(self, messages):
        """One pipeline of push scripts: one round trip for a dispatcher's whole batch. Each
        script call stays within one queue's slot."""
        if len(messages) == 1:  # a pipeline checks its scripts first: one more round trip
            return [self.push(messages[0])]
        pipe = self.redis.pipeline(transaction=False)
        for message in messages:
            self._push(
                keys=self._push_keys(message),
                args=[message.encode(), MARKER_TTL_S, '0'],
                client=pipe,
            )
        return [bool(result) for result in pipe.execute()]

    @_translate
    def pop(self, queue_name, consumer_id, timeout_s):
        keys = self._bands(queue_name) + [
            self._processing(queue_name, consumer_id),
            self._key(queue_name, 'consumers'),
        ]
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
        self._ack(
            keys=[self._processing(q, delivery.consumer_id), self._marker(delivery.message)],
            args=[delivery.raw],
        )

    @_translate
    def release(self, delivery):
        m = delivery.message
        self._release(
            keys=[
                self._processing(m.queue_name, delivery.consumer_id),
                self._bands(m.queue_name)[band_of(m.priority)],
                self._key(m.queue_name, 'wake'),
            ],
            args=[delivery.raw],
        )

    @_translate
    def epoch(self):
        key = '%s:epoch' % self.prefix
        self.redis.set(key, os.urandom(8).hex(), nx=True)  # only where it is gone
        return self.redis.get(key)

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
                keys = (
                    [self._processing(queue_name, consumer_id)]
                    + self._bands(queue_name)
                    + [self._key(queue_name, 'wake')]
                )
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
        return {job_id for job_id, flag in zip(job_ids, flags, strict=True) if flag}

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
