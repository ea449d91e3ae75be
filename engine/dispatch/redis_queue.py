"""The Redis-list queue: reliable pops into a per-consumer processing list, priority bands, an
idempotent push, orphan recovery and the cancel fast path, each an atomic Lua script.

A queue is spread over AIJOB_QUEUE_SHARDS shards, each with its own hash tag: every key of a
shard is ``{prefix}:{tag}:…``, so each script's keys share one slot (architecture decisions 5 and
13) and the shards of a queue spread over a Redis Cluster's nodes. One shard keeps the unsharded
tag (the queue's name), so a deployment upgraded in place keeps its messages. Redis errors stop at
this edge as QueueUnavailableError.

The client speaks to whatever topology AIJOB_REDIS_URL names (redis_client): one server, a
cluster, or a Sentinel-watched master. It is built at first use, so a process starts while Redis
is down and its loops retry, as they do after any outage.
"""

import itertools
import os
import threading
import time
import zlib
from dataclasses import dataclass

from ..core.errors import QueueUnavailableError
from ..core.registry import QUEUE_NAMES
from .queue import BANDS, Delivery, Message, Queue, band_of
from .redis_client import connect, is_cluster, translate_errors

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

# KEYS: bands (most urgent first)..., processing, consumers. ARGV: consumer id, how many at most.
_POP_MANY = """
redis.call('SADD', KEYS[#KEYS], ARGV[1])
local taken, limit = {}, tonumber(ARGV[2])
for i = 1, #KEYS - 2 do
  while #taken < limit do
    local raw = redis.call('LMOVE', KEYS[i], KEYS[#KEYS - 1], 'LEFT', 'RIGHT')
    if not raw then break end
    taken[#taken + 1] = raw
  end
end
return taken
"""

_ACK = """
redis.call('LREM', KEYS[1], 1, ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""

# KEYS: processing, then one marker per message. ARGV: the messages, in the markers' order.
_ACK_MANY = """
for i = 1, #ARGV do
  redis.call('LREM', KEYS[1], 1, ARGV[i])
  if redis.call('GET', KEYS[i + 1]) == ARGV[i] then redis.call('DEL', KEYS[i + 1]) end
end
return #ARGV
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
# Every process re-adds its shards to the queue's registry this often, so a registry lost with
# Redis's data comes back; consumers re-read it this often to find shards to drain.
REGISTER_EVERY_S = 30.0
DISCOVER_EVERY_S = 2.0
READY_KEY_TTL_MS = 5000  # the keys /readyz writes expire at once
# A cluster refuses a BLPOP over keys of several slots: an idle consumer watches one shard's wake
# list this long, then the next one.
CLUSTER_WAIT_SLICE_S = 0.25


@dataclass(frozen=True)
class _Discovery:
    """A queue's shards beyond the configured ones, as last read from its registry."""

    expires: float  # monotonic
    extra: tuple  # every other tag some process registered
    draining: tuple  # those of them still holding waiting messages


class RedisQueue(Queue):
    """Redis lists. Every key starts with one prefix and, per queue shard, a hash tag
    (``aijob:{ai-interactive}:…`` with one shard, ``aijob:{ai-interactive:3}:…`` with several) so
    a shard's keys share a Redis Cluster slot."""

    def __init__(self, url, prefix='aijob', shards=1):
        self.prefix = prefix
        self.shards = shards
        self._rotation = itertools.count()  # where the next pop starts, so no shard starves
        self._registered_at = None
        self._discovered = {}  # queue -> _Discovery
        self._discover_lock = threading.Lock()
        self.url = url
        self._client = None
        self._scripts = None
        self._client_lock = threading.Lock()

    @property
    def redis(self):
        """The client, built at first use (a cluster's is built from its slot map, which needs
        a node to answer; until one does every call fails QueueUnavailableError)."""
        return self._connect()

    def _connect(self):
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    client = connect(self.url)
                    self._scripts = {
                        name: client.register_script(source)
                        for name, source in (
                            ('push', _PUSH),
                            ('pop', _POP),
                            ('pop_many', _POP_MANY),
                            ('ack', _ACK),
                            ('ack_many', _ACK_MANY),
                            ('release', _RELEASE),
                            ('recover', _RECOVER),
                        )
                    }
                    self._client = client
        return self._client

    def _script(self, name):
        self._connect()  # the scripts are registered with the client
        return self._scripts[name]

    # -- shards and keys
    def shard_tags(self, queue_name):
        """The hash tags of a queue's configured shards: the queue's name alone with one shard
        (the key names of an unsharded deployment), else ``queue:0`` … ``queue:N-1``."""
        if self.shards == 1:
            return [queue_name]
        return ['%s:%d' % (queue_name, i) for i in range(self.shards)]

    def tag_of(self, message):
        """A job's shard, from its id: the same in every process with the same shard count."""
        if self.shards == 1:
            return message.queue_name
        shard = zlib.crc32(message.job_id.encode('utf-8')) % self.shards
        return '%s:%d' % (message.queue_name, shard)

    def _key(self, tag, *parts):
        return ':'.join((self.prefix, '{%s}' % tag) + parts)

    def _bands(self, tag):
        return [self._key(tag, 'band', str(b)) for b in range(BANDS)]

    def _processing(self, tag, consumer_id):
        return self._key(tag, 'processing', consumer_id)

    def _marker(self, tag, message):
        return self._key(tag, 'job', message.queue_job_id)

    def _registry(self, queue_name):
        """The set of every shard tag a process has pushed to or consumed from (its own slot:
        only ever read alone)."""
        return '%s:shards:%s' % (self.prefix, queue_name)

    def heartbeat_key(self, consumer_id):
        return '%s:worker:heartbeat:%s' % (self.prefix, consumer_id)

    def cancel_key(self, job_id):
        return '%s:job:cancel:%s' % (self.prefix, job_id)

    def _register(self):
        """Add this process's shards to the queues' registries (at most every
        REGISTER_EVERY_S), so consumers configured with fewer shards find them and drain
        them."""
        now = time.monotonic()
        if self._registered_at is not None and now < self._registered_at + REGISTER_EVERY_S:
            return
        pipe = self.redis.pipeline(transaction=False)
        for queue_name in QUEUE_NAMES:
            pipe.sadd(self._registry(queue_name), *self.shard_tags(queue_name))
        pipe.execute()
        self._registered_at = now

    def _discover(self, queue_name):
        """The queue's registered shards beyond the configured ones, re-read every
        DISCOVER_EVERY_S: all of them (recovery, markers, counts) and those still holding
        waiting messages (which consumers drain)."""
        found = self._discovered.get(queue_name)
        if found is not None and time.monotonic() < found.expires:
            return found
        with self._discover_lock:  # one thread reads; the others use its answer
            found = self._discovered.get(queue_name)
            if found is None or time.monotonic() >= found.expires:
                found = self._read_registry(queue_name)
                self._discovered[queue_name] = found
        return found

    def _read_registry(self, queue_name):
        configured = set(self.shard_tags(queue_name))
        extra = sorted(set(self.redis.smembers(self._registry(queue_name))) - configured)
        draining = ()
        if extra:
            lengths = self._lengths([band for tag in extra for band in self._bands(tag)])
            draining = tuple(
                tag for i, tag in enumerate(extra) if sum(lengths[i * BANDS : (i + 1) * BANDS])
            )
        return _Discovery(time.monotonic() + DISCOVER_EVERY_S, tuple(extra), draining)

    def _all_tags(self, queue_name):
        return self.shard_tags(queue_name) + list(self._discover(queue_name).extra)

    def _lengths(self, keys):
        """LLEN of each key, in one pipeline (keys of any slots)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return pipe.execute()

    # -- contract
    def _push_keys(self, message):
        tag = self.tag_of(message)
        return [
            self._marker(tag, message),
            self._bands(tag)[band_of(message.priority)],
            self._key(tag, 'wake'),
        ]

    @translate_errors
    def push(self, message, force=False):
        self._register()
        args = [message.encode(), MARKER_TTL_S, '1' if force else '0']
        return bool(self._script('push')(keys=self._push_keys(message), args=args))

    @translate_errors
    def push_many(self, messages):
        """One pipeline of push scripts: one round trip for a dispatcher's whole batch. Each
        script call stays within one queue's slot."""
        if len(messages) == 1:  # a pipeline checks its scripts first: one more round trip
            return [self.push(messages[0])]
        self._register()
        pipe = self.redis.pipeline(transaction=False)
        push, cluster = self._script('push'), is_cluster(self.redis)
        for message in messages:
            keys, args = self._push_keys(message), [message.encode(), MARKER_TTL_S, '0']
            if cluster:
                # A cluster pipeline refuses EVALSHA (it could not load a script a node
                # lacks): the script's text goes with each call, cached by the node.
                pipe.execute_command('EVAL', _PUSH, len(keys), *keys, *args)
            else:
                push(keys=keys, args=args, client=pipe)
        return [bool(result) for result in pipe.execute()]

    @translate_errors
    def pop(self, queue_name, consumer_id, timeout_s):
        """Sweep the queue's shards, each time from the next one (so a busy shard cannot starve
        the others); priority bands hold within each shard. Shards beyond the configured count
        that still hold messages are swept too, so changing the count loses nothing."""
        self._register()
        deadline = time.monotonic() + timeout_s
        while True:
            tags = self.shard_tags(queue_name) + list(self._discover(queue_name).draining)
            start = next(self._rotation) % len(tags)
            tags = tags[start:] + tags[:start]
            for tag in tags:
                keys = self._bands(tag) + [
                    self._processing(tag, consumer_id),
                    self._key(tag, 'consumers'),
                ]
                raw = self._script('pop')(keys=keys, args=[consumer_id])
                if raw:
                    return Delivery(Message.decode(raw), raw, consumer_id, tag)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._wait([self._key(tag, 'wake') for tag in tags], remaining)

    @translate_errors
    def pop_many(self, queue_name, consumer_id, limit, timeout_s):
        """``pop``'s sweep, taking up to ``limit`` messages: one script (one round trip) per
        shard visited, most urgent band first within each shard."""
        self._register()
        deadline = time.monotonic() + timeout_s
        while True:
            tags = self.shard_tags(queue_name) + list(self._discover(queue_name).draining)
            start = next(self._rotation) % len(tags)
            tags = tags[start:] + tags[:start]
            deliveries = []
            for tag in tags:
                keys = self._bands(tag) + [
                    self._processing(tag, consumer_id),
                    self._key(tag, 'consumers'),
                ]
                args = [consumer_id, limit - len(deliveries)]
                raws = self._script('pop_many')(keys=keys, args=args)
                deliveries += [Delivery(Message.decode(r), r, consumer_id, tag) for r in raws]
                if len(deliveries) >= limit:
                    break
            if deliveries:
                return deliveries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._wait([self._key(tag, 'wake') for tag in tags], remaining)

    def _wait(self, wake_keys, remaining):
        """Sleep until a push wakes us (BLPOP on the shards' wake lists), then sweep again. One
        server watches every shard in one BLPOP; a cluster refuses keys of several slots in one
        command, so there the first shard (a different one each sweep) is watched for a slice."""
        if len(wake_keys) > 1 and is_cluster(self.redis):
            wake_keys, remaining = wake_keys[:1], min(remaining, CLUSTER_WAIT_SLICE_S)
        self.redis.blpop(wake_keys, timeout=max(0.01, min(remaining, 5)))

    @translate_errors
    def ack(self, delivery):
        tag = delivery.source
        self._script('ack')(
            keys=[self._processing(tag, delivery.consumer_id), self._marker(tag, delivery.message)],
            args=[delivery.raw],
        )

    @translate_errors
    def ack_many(self, deliveries):
        """One script per shard the deliveries came from (one round trip with one shard)."""
        by_tag = {}
        for delivery in deliveries:
            by_tag.setdefault((delivery.source, delivery.consumer_id), []).append(delivery)
        for (tag, consumer_id), group in by_tag.items():
            markers = [self._marker(tag, d.message) for d in group]
            self._script('ack_many')(
                keys=[self._processing(tag, consumer_id)] + markers,
                args=[d.raw for d in group],
            )

    @translate_errors
    def release(self, delivery):
        m, tag = delivery.message, delivery.source
        self._script('release')(
            keys=[
                self._processing(tag, delivery.consumer_id),
                self._bands(tag)[band_of(m.priority)],
                self._key(tag, 'wake'),
            ],
            args=[delivery.raw],
        )

    @translate_errors
    def epoch(self):
        key = '%s:epoch' % self.prefix
        self.redis.set(key, os.urandom(8).hex(), nx=True)  # only where it is gone
        return self.redis.get(key)

    @translate_errors
    def heartbeat(self, consumer_id, ttl_ms):
        self.redis.set(self.heartbeat_key(consumer_id), '1', px=int(ttl_ms))

    @translate_errors
    def recover_orphans(self):
        """Every shard of every queue, those beyond the configured count included."""
        moved, alive = 0, {}
        for queue_name in QUEUE_NAMES:
            for tag in self._all_tags(queue_name):
                moved += self._recover_shard(tag, alive)
        return moved

    def _recover_shard(self, tag, alive):
        moved = 0
        consumers_key = self._key(tag, 'consumers')
        for consumer_id in self.redis.smembers(consumers_key):
            if consumer_id not in alive:
                alive[consumer_id] = bool(self.redis.exists(self.heartbeat_key(consumer_id)))
            if alive[consumer_id]:
                continue
            keys = (
                [self._processing(tag, consumer_id)] + self._bands(tag) + [self._key(tag, 'wake')]
            )
            moved += int(self._script('recover')(keys=keys))
            self.redis.srem(consumers_key, consumer_id)
        return moved

    @translate_errors
    def has_entry(self, message):
        """Its marker in its shard, or in any other registered shard (a process with another
        shard count may have pushed it)."""
        tags = [self.tag_of(message)]
        tags += [t for t in self._all_tags(message.queue_name) if t != tags[0]]
        pipe = self.redis.pipeline(transaction=False)
        for tag in tags:
            pipe.exists(self._marker(tag, message))
        return any(pipe.execute())

    @translate_errors
    def signal_cancel(self, job_id, ttl_s=300):
        self.redis.set(self.cancel_key(job_id), '1', ex=ttl_s)

    @translate_errors
    def cancel_signalled(self, job_ids):
        job_ids = list(job_ids)
        if not job_ids:
            return set()
        keys = [self.cancel_key(j) for j in job_ids]
        if is_cluster(self.redis):
            flags = self.redis.mget_nonatomic(keys)  # one MGET per slot, answers in order
        else:
            flags = self.redis.mget(keys)
        return {job_id for job_id, flag in zip(job_ids, flags, strict=True) if flag}

    @translate_errors
    def ping(self):
        self.redis.ping()

    @translate_errors
    def check_ready(self):
        """A write where the queues live: a short-lived key SET in every configured shard of
        every queue (on a cluster, the node of each shard's slot), so a read-only replica, a
        lost master or an unreachable shard fails. A single-server URL that names a cluster
        node is the wrong node: its keys of other slots would be MOVED."""
        client = self.redis
        if not is_cluster(client) and client.info('cluster').get('cluster_enabled'):
            raise QueueUnavailableError('redis: a cluster node behind a single-server URL')
        pipe = client.pipeline(transaction=False)
        for queue_name in QUEUE_NAMES:
            for tag in self.shard_tags(queue_name):
                pipe.set(self._key(tag, 'ready'), '1', px=READY_KEY_TTL_MS)
        pipe.execute()

    @translate_errors
    def depth(self, queue_name):
        return sum(self._lengths([b for t in self._all_tags(queue_name) for b in self._bands(t)]))

    @translate_errors
    def in_flight(self, queue_name):
        processing = []
        for tag in self._all_tags(queue_name):
            for consumer_id in self.redis.smembers(self._key(tag, 'consumers')):
                processing.append(self._processing(tag, consumer_id))
        return sum(self._lengths(processing))

    @translate_errors
    def shard_lengths(self, queue_name):
        tags = self._all_tags(queue_name)
        processing = {}
        for tag in tags:
            consumers = self.redis.smembers(self._key(tag, 'consumers'))
            processing[tag] = [self._processing(tag, consumer) for consumer in consumers]
        keys = [band for tag in tags for band in self._bands(tag)]
        keys += [key for tag in tags for key in processing[tag]]
        lengths = iter(self._lengths(keys))
        waiting = {tag: sum(next(lengths) for _ in range(BANDS)) for tag in tags}
        return {tag: (waiting[tag], sum(next(lengths) for _ in processing[tag])) for tag in tags}

    @translate_errors
    def consumers(self):
        """Every consumer registered on a shard of any queue, kept if its heartbeat key lives."""
        known = set()
        for queue_name in QUEUE_NAMES:
            for tag in self._all_tags(queue_name):
                known.update(self.redis.smembers(self._key(tag, 'consumers')))
        known = sorted(known)
        pipe = self.redis.pipeline(transaction=False)
        for consumer_id in known:
            pipe.pttl(self.heartbeat_key(consumer_id))
        ttls = pipe.execute() if known else []
        return {c: int(ttl) for c, ttl in zip(known, ttls, strict=True) if ttl and ttl > 0}

    def close(self):
        if self._client is not None:
            self._client.close()


# ---------------------------------------------------------------- in-process
