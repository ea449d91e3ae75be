"""The Redis-list queue: reliable pops into a per-consumer processing list, priority bands, fair
turns per user within each band (with weights and a running cap over every queue), an idempotent
push, orphan recovery and the cancel fast path, each an atomic Lua script.

The queues are spread over AIJOB_QUEUE_SHARDS shards. A shard is a hash tag, the shard's number,
shared by every queue: every key of shard s is ``{prefix}:{s}:…`` (a queue's own keys
``{prefix}:{s}:QUEUE:…``), so each script's keys share one slot (architecture decisions 5, 13
and 19) and the shards spread over a Redis Cluster's nodes. A user's messages, in every queue,
all go to one shard (chosen from the user key), so one script sees the user's turns and the
user's running count over all the queues: the running cap is exact across them.
Redis errors stop at this edge as QueueUnavailableError.

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
from ..core.fairness import weights_by_key
from ..core.registry import QUEUE_NAMES
from .queue import BANDS, Delivery, Message, Queue, band_of
from .redis_client import connect, is_cluster, translate_errors

# Per shard ({s}), one queue's keys, per priority band: the band's shared list
# ``QUEUE:band:N`` (messages without a user key, and those of a deployment before fair queues),
# each user's list ``QUEUE:band:N:u:USERKEY``, the rotation ``QUEUE:band:N:users``,
# ``QUEUE:band:N:turn`` ("USERKEY n": the head user's turns in a row, for weights) and
# ``QUEUE:band:N:round`` (the round of the last message taken); and per consumer its processing
# list ``QUEUE:processing:CONSUMER``, and the queue's ``QUEUE:wake`` list (what an idle consumer
# blocks on). The rotation is a sorted set of the users with messages waiting, scored
# ROUND * 2^20 + a number from the shard's ``seq`` counter (arrival order within a round): the
# lowest score has the turn. A user whose turn ends moves to its next round; a user who arrives
# joins the round being served, so a newcomer goes before the users already served in it
# (start-time fair queueing, in whole turns).
# Per shard, shared by its queues: ``seq``, ``weights`` (user key -> weight, only weights other
# than 1), ``running`` (user key -> the user's messages in consumers' processing lists of every
# queue: what the running cap counts), ``consumers`` (every consumer that popped there) and the
# push markers ``job:QUEUEJOBID`` (the queue job id names its queue).
# A user's list is named from its band's key inside the script: same hash tag, same slot.

# KEYS: marker, band, rotation, seq, weights, wake, round. ARGV: message, marker TTL, force,
# user key, weight.
_PUSH = """
if ARGV[3] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return 0
end
local user = ARGV[4]
if user == '' then
  redis.call('RPUSH', KEYS[2], ARGV[1])
else
  redis.call('RPUSH', KEYS[2] .. ':u:' .. user, ARGV[1])
  if not redis.call('ZSCORE', KEYS[3], user) then
    -- The round being served; never more than one behind the head's (a lost round key must not
    -- give a newcomer every turn until it catches up).
    local round = tonumber(redis.call('GET', KEYS[7]) or '0')
    local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2]
    if head then round = math.max(round, math.floor(tonumber(head) / 1048576) - 1) end
    redis.call('ZADD', KEYS[3], round * 1048576 + redis.call('INCR', KEYS[4]) % 1048576, user)
  end
  if ARGV[5] == '1' then
    redis.call('HDEL', KEYS[5], user)
  else
    redis.call('HSET', KEYS[5], user, ARGV[5])
  end
end
redis.call('LPUSH', KEYS[6], '1')
redis.call('LTRIM', KEYS[6], 0, 63)
return 1
"""

# KEYS: processing, consumers, seq, weights, running, then per band (most urgent first): band,
# rotation, turn, round. ARGV: consumer id, how many at most, the running cap (0: none).
# Registers the consumer (for orphan recovery) in the same round trip; LMOVE in a script is as
# atomic as BLMOVE. In each band: the shared list first, then the users in turn; a user at the cap
# moves to its next round, its messages left waiting (each user passed over at most once per band
# and pop).
# A visit to the head user takes every message it would take one turn after another before
# another user could come first: the rest of its weight's turns in a row, or, alone in the
# rotation, as many as the pop wants (within the cap). The rotation, turn and round are then
# written once, as the single turns would have left them (the round advances by one per w
# messages), and several messages move in three commands: what one user's burst costs stays what
# one message costs, where a message a turn cost eight commands.
_POP = """
redis.call('SADD', KEYS[2], ARGV[1])
local processing, seq, weights, running = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local taken, limit, cap = {}, tonumber(ARGV[2]), tonumber(ARGV[3])
local weighted = redis.call('EXISTS', weights) == 1
local function move(list, n)
  if n == 1 then
    local raw = redis.call('LMOVE', list, processing, 'LEFT', 'RIGHT')
    taken[#taken + 1] = raw
    return
  end
  local raws = redis.call('LRANGE', list, 0, n - 1)
  redis.call('LTRIM', list, n, -1)
  redis.call('RPUSH', processing, unpack(raws))
  for _, raw in ipairs(raws) do taken[#taken + 1] = raw end
end
local function to_round(rotation, user, round)
  redis.call('ZADD', rotation, round * 1048576 + redis.call('INCR', seq) % 1048576, user)
end
for b = 6, #KEYS, 4 do
  local band, rotation, turn, served = KEYS[b], KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  while #taken < limit do
    local raw = redis.call('LMOVE', band, processing, 'LEFT', 'RIGHT')
    if not raw then break end
    taken[#taken + 1] = raw
  end
  local users = redis.call('ZCARD', rotation)
  local passes, last = math.min(512, users), nil
  while #taken < limit and passes > 0 do
    local head = redis.call('ZRANGE', rotation, 0, 0, 'WITHSCORES')
    local user, score = head[1], head[2]
    if not user then break end
    local list, round = band .. ':u:' .. user, math.floor(tonumber(score) / 1048576)
    local waiting = redis.call('LLEN', list)
    local room = limit - #taken
    if cap > 0 then
      room = math.min(room, cap - tonumber(redis.call('HGET', running, user) or '0'))
    end
    if waiting == 0 then
      redis.call('ZREM', rotation, user)  -- nothing waiting (its list lost): out of the turns
      users = users - 1
    elseif room <= 0 then
      to_round(rotation, user, round + 1)  -- at the cap: passed over, its messages left waiting
      passes = passes - 1
    else
      local weight = weighted and tonumber(redis.call('HGET', weights, user) or '1') or 1
      local turns = 0
      if weight > 1 then
        local who, n = string.match(redis.call('GET', turn) or '', '^(%S+) (%d+)$')
        -- a weight lowered since the turn began: the turn ends at this message
        if who == user then turns = math.min(tonumber(n), weight - 1) end
      end
      local n = math.min(room, waiting)
      if users > 1 then n = math.min(n, weight - turns) end
      move(list, n)
      redis.call('HINCRBY', running, user, n)
      turns = turns + n
      last = round + math.floor((turns - 1) / weight)
      local next_round = round + math.floor(turns / weight)
      if waiting == n then
        redis.call('ZREM', rotation, user)
        users = users - 1
        if weight > 1 then redis.call('DEL', turn) end
      else
        if next_round > round then to_round(rotation, user, next_round) end
        if turns % weight > 0 then
          redis.call('SET', turn, user .. ' ' .. (turns % weight))
        elseif weight > 1 then
          redis.call('DEL', turn)
        end
      end
    end
  end
  if last then redis.call('SET', served, last) end
end
return taken
"""

# A wake-up in each of the shard's queues' wake lists (``wakes``: a table of keys), and the drop
# of a message's user from ``running`` once its message left a processing list: when that user was
# at the cap, every queue of the shard is woken, since a consumer of any of them may have passed
# the user over.
_DONE = """
local function wake(wakes)
  for _, key in ipairs(wakes) do
    redis.call('LPUSH', key, '1')
    redis.call('LTRIM', key, 0, 63)
  end
end
local function done(running, wakes, user, cap)
  if user == '' then return end
  local left = redis.call('HINCRBY', running, user, -1)
  if left <= 0 then redis.call('HDEL', running, user) end
  if cap > 0 and left + 1 >= cap then wake(wakes) end
end
"""

# KEYS: processing, marker, running, then the shard's wake lists. ARGV: message, user key, cap.
_ACK = (
    _DONE
    + """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  done(KEYS[3], {unpack(KEYS, 4)}, ARGV[2], tonumber(ARGV[3]))
end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
"""
)

# KEYS: processing, running, the shard's wake lists (ARGV[2] of them), then one marker per
# message. ARGV: cap, how many wake lists, then each message and its user key, in the markers'
# order.
_ACK_MANY = (
    _DONE
    + """
local cap, first = tonumber(ARGV[1]), 3 + tonumber(ARGV[2])
local wakes = {unpack(KEYS, 3, first - 1)}
for i = first, #KEYS do
  local n = i - first + 1
  local raw, user = ARGV[1 + 2 * n], ARGV[2 + 2 * n]
  if redis.call('LREM', KEYS[1], 1, raw) == 1 then done(KEYS[2], wakes, user, cap) end
  if redis.call('GET', KEYS[i]) == raw then redis.call('DEL', KEYS[i]) end
end
return #KEYS - first + 1
"""
)

# Back to the front of its user's list, and its user to the front of the rotation: a message
# handed back goes first, as before fair queues (the turn it was taken on is given back).
_FRONT = """
local function front(band, rotation, seq, raw, user)
  if user == '' then
    redis.call('LPUSH', band, raw)
    return
  end
  redis.call('LPUSH', band .. ':u:' .. user, raw)
  local head = redis.call('ZRANGE', rotation, 0, 0, 'WITHSCORES')
  if head[1] ~= user then
    local score = head[2] and (tonumber(head[2]) - 1) or (redis.call('INCR', seq) % 1048576)
    redis.call('ZADD', rotation, score, user)
  end
end
"""

# KEYS: processing, band, rotation, seq, running, then the shard's wake lists. ARGV: message,
# user key. Wakes every queue of the shard: the message waits again, and its user's count dropped.
_RELEASE = (
    _DONE
    + _FRONT
    + """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  local wakes = {unpack(KEYS, 6)}
  front(KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
  done(KEYS[5], wakes, ARGV[2], 0)
  wake(wakes)
end
return 1
"""
)

# KEYS: processing, seq, running, then per band: band, rotation; then the shard's wake lists.
# ARGV: how many bands. Moves every message of one queue's processing list back to the front of
# its user's list in its band, and wakes every queue of the shard.
_RECOVER = (
    _DONE
    + _FRONT
    + """
local moved, bands = 0, tonumber(ARGV[1])
local wakes = {unpack(KEYS, 4 + 2 * bands)}
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local message = cjson.decode(raw)
  local priority = tonumber(message['priority']) or 50
  local band = math.min(bands - 1, math.floor(math.max(0, priority) * bands / 101))
  local user = message['userKey']
  if type(user) ~= 'string' then user = '' end
  front(KEYS[4 + 2 * band], KEYS[5 + 2 * band], KEYS[2], raw, user)
  done(KEYS[3], wakes, user, 0)
  moved = moved + 1
end
if moved > 0 then wake(wakes) end
return moved
"""
)

# KEYS: running, consumers. ARGV: the name of each queue's processing lists without the
# consumer id. ``running`` counted again from what the processing lists of the shard's consumers
# hold in every queue, all in one script, so no pop can come between the count and the write
# (the reaper's repair: a count left wrong by a Redis that lost some keys is right again).
_RECOUNT = """
local counts = {}
for _, consumer in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  for _, processing in ipairs(ARGV) do
    for _, raw in ipairs(redis.call('LRANGE', processing .. consumer, 0, -1)) do
      local user = cjson.decode(raw)['userKey']
      if type(user) == 'string' and user ~= '' then counts[user] = (counts[user] or 0) + 1 end
    end
  end
end
redis.call('DEL', KEYS[1])
for user, n in pairs(counts) do redis.call('HSET', KEYS[1], user, n) end
return 1
"""

# KEYS: per band: band, rotation. The messages waiting in a shard: every band's shared list and
# the lists of the users in its rotation.
_WAITING = """
local total = 0
for i = 1, #KEYS, 2 do
  total = total + redis.call('LLEN', KEYS[i])
  for _, user in ipairs(redis.call('ZRANGE', KEYS[i + 1], 0, -1)) do
    total = total + redis.call('LLEN', KEYS[i] .. ':u:' .. user)
  end
end
return total
"""

MARKER_TTL_S = 7 * 24 * 3600
# Every process re-adds its shards to the registry this often, so a registry lost with Redis's
# data comes back; consumers re-read it this often to find shards to drain.
REGISTER_EVERY_S = 30.0
DISCOVER_EVERY_S = 2.0
READY_KEY_TTL_MS = 5000  # the keys /readyz writes expire at once
# A cluster refuses a BLPOP over keys of several slots: an idle consumer watches one shard's wake
# list this long, then the next one.
CLUSTER_WAIT_SLICE_S = 0.25


@dataclass(frozen=True)
class _Discovery:
    """The shards beyond the configured ones, as last read from the registry."""

    expires: float  # monotonic
    extra: tuple  # every other tag some process registered
    draining: dict  # queue name -> those of them still holding its waiting messages


class RedisQueue(Queue):
    """Redis lists. Every key starts with one prefix and a shard's hash tag, the shard's number
    (``aijob:{0}:ai-interactive:band:1``; with four shards ``{0}`` … ``{3}``), so a shard's
    keys, those of every queue, share a Redis Cluster slot."""

    def __init__(self, url, prefix='aijob', shards=1, user_weights=None, max_running_per_user=0):
        self.prefix = prefix
        self.shards = shards
        self._weights = weights_by_key(user_weights)
        self.max_running_per_user = max_running_per_user
        self._rotation = itertools.count()  # where the next pop starts, so no shard starves
        self._registered_at = None
        self._discovered = None  # _Discovery
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
                            ('ack', _ACK),
                            ('ack_many', _ACK_MANY),
                            ('release', _RELEASE),
                            ('recover', _RECOVER),
                            ('recount', _RECOUNT),
                            ('waiting', _WAITING),
                        )
                    }
                    self._client = client
        return self._client

    def _script(self, name):
        self._connect()  # the scripts are registered with the client
        return self._scripts[name]

    # -- shards and keys
    def shard_tags(self):
        """The hash tags of the configured shards: ``0`` … ``N-1``, the same for every queue."""
        return [str(shard) for shard in range(self.shards)]

    def tag_of(self, message):
        """A job's shard, from its user key (from its id when it has none): the same in every
        process with the same shard count, and the same for the user's messages of every queue,
        so the user's turns and running count sit in one slot."""
        spread = message.user_key or message.job_id
        return str(zlib.crc32(spread.encode('utf-8')) % self.shards)

    def _key(self, tag, *parts):
        return ':'.join((self.prefix, '{%s}' % tag) + parts)

    def _bands(self, tag, queue_name):
        """Each band's shared list; the band's users' lists and rotation hang off its name."""
        return [self._key(tag, queue_name, 'band', str(b)) for b in range(BANDS)]

    def _band_keys(self, tag, queue_name, *parts):
        """Per band, most urgent first: its shared list, then each of ``parts`` of it
        ('users': the rotation, 'turn', 'round')."""
        keys = []
        for band in self._bands(tag, queue_name):
            keys += [band] + [band + ':' + part for part in parts]
        return keys

    def _processing(self, tag, queue_name, consumer_id):
        return self._key(tag, queue_name, 'processing', consumer_id)

    def _wake(self, tag, queue_name):
        return self._key(tag, queue_name, 'wake')

    def _wakes(self, tag):
        """The wake lists of every queue of a shard."""
        return [self._wake(tag, queue_name) for queue_name in QUEUE_NAMES]

    def _marker(self, tag, message):
        return self._key(tag, 'job', message.queue_job_id)

    def _registry(self):
        """The set of every shard tag a process has pushed to or consumed from (its own slot:
        only ever read alone)."""
        return '%s:shard-tags' % self.prefix

    def heartbeat_key(self, consumer_id):
        return '%s:worker:heartbeat:%s' % (self.prefix, consumer_id)

    def cancel_key(self, job_id):
        return '%s:job:cancel:%s' % (self.prefix, job_id)

    def _register(self):
        """Add this process's shards to the registry (at most every REGISTER_EVERY_S), so
        consumers configured with fewer shards find them and drain them."""
        now = time.monotonic()
        if self._registered_at is not None and now < self._registered_at + REGISTER_EVERY_S:
            return
        self.redis.sadd(self._registry(), *self.shard_tags())
        self._registered_at = now

    def _discover(self):
        """The registered shards beyond the configured ones, re-read every DISCOVER_EVERY_S:
        all of them (recovery, markers, counts) and, per queue, those still holding its waiting
        messages (which its consumers drain)."""
        found = self._discovered
        if found is not None and time.monotonic() < found.expires:
            return found
        with self._discover_lock:  # one thread reads; the others use its answer
            found = self._discovered
            if found is None or time.monotonic() >= found.expires:
                found = self._read_registry()
                self._discovered = found
        return found

    def _read_registry(self):
        configured = set(self.shard_tags())
        extra = sorted(set(self.redis.smembers(self._registry())) - configured)
        draining = {
            queue_name: tuple(tag for tag in extra if self._waiting(tag, queue_name))
            for queue_name in QUEUE_NAMES
        }
        return _Discovery(time.monotonic() + DISCOVER_EVERY_S, tuple(extra), draining)

    def _all_tags(self):
        return self.shard_tags() + list(self._discover().extra)

    def _waiting(self, tag, queue_name):
        """A queue's messages waiting in a shard (one read-only script: its slot's keys)."""
        return int(self._script('waiting')(keys=self._band_keys(tag, queue_name, 'users')))

    def _lengths(self, keys):
        """LLEN of each key, in one pipeline (keys of any slots)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return pipe.execute()

    # -- contract
    def _push_keys(self, message):
        tag = self.tag_of(message)
        band = self._bands(tag, message.queue_name)[band_of(message.priority)]
        return [
            self._marker(tag, message),
            band,
            band + ':users',
            self._key(tag, 'seq'),
            self._key(tag, 'weights'),
            self._wake(tag, message.queue_name),
            band + ':round',
        ]

    def _push_args(self, message, force):
        weight = self._weights.get(message.user_key, 1)
        return [message.encode(), MARKER_TTL_S, '1' if force else '0', message.user_key, weight]

    @translate_errors
    def push(self, message, force=False):
        self._register()
        args = self._push_args(message, force)
        return bool(self._script('push')(keys=self._push_keys(message), args=args))

    @translate_errors
    def push_many(self, messages):
        """One pipeline of push scripts: one round trip for a dispatcher's whole batch. Each
        script call stays within one shard's slot."""
        if len(messages) == 1:  # a pipeline checks its scripts first: one more round trip
            return [self.push(messages[0])]
        self._register()
        pipe = self.redis.pipeline(transaction=False)
        push, cluster = self._script('push'), is_cluster(self.redis)
        for message in messages:
            keys, args = self._push_keys(message), self._push_args(message, False)
            if cluster:
                # A cluster pipeline refuses EVALSHA (it could not load a script a node
                # lacks): the script's text goes with each call, cached by the node.
                pipe.execute_command('EVAL', _PUSH, len(keys), *keys, *args)
            else:
                push(keys=keys, args=args, client=pipe)
        return [bool(result) for result in pipe.execute()]

    @translate_errors
    def pop(self, queue_name, consumer_id, timeout_s):
        deliveries = self.pop_many(queue_name, consumer_id, 1, timeout_s)
        return deliveries[0] if deliveries else None

    @translate_errors
    def pop_many(self, queue_name, consumer_id, limit, timeout_s):
        """Sweep the shards, each time from the next one (so a busy shard cannot starve the
        others), taking up to ``limit`` of the queue's messages: one script (one round trip) per
        shard visited, most urgent band first and the users in turn within each shard. Shards
        beyond the configured count that still hold the queue's messages are swept too, so
        changing the count loses nothing."""
        self._register()
        deadline = time.monotonic() + timeout_s
        while True:
            tags = self.shard_tags() + list(self._discover().draining[queue_name])
            start = next(self._rotation) % len(tags)
            tags = tags[start:] + tags[:start]
            deliveries = []
            for tag in tags:
                keys = self._pop_keys(tag, queue_name, consumer_id)
                args = [consumer_id, limit - len(deliveries), self.max_running_per_user]
                raws = self._script('pop')(keys=keys, args=args)
                deliveries += [Delivery(Message.decode(r), r, consumer_id, tag) for r in raws]
                if len(deliveries) >= limit:
                    break
            if deliveries:
                return deliveries
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._wait([self._wake(tag, queue_name) for tag in tags], remaining)

    def _pop_keys(self, tag, queue_name, consumer_id):
        return [
            self._processing(tag, queue_name, consumer_id),
            self._key(tag, 'consumers'),
            self._key(tag, 'seq'),
            self._key(tag, 'weights'),
            self._key(tag, 'running'),
        ] + self._band_keys(tag, queue_name, 'users', 'turn', 'round')

    def _wait(self, wake_keys, remaining):
        """Sleep until a push wakes us (BLPOP on the shards' wake lists), then sweep again. One
        server watches every shard in one BLPOP; a cluster refuses keys of several slots in one
        command, so there the first shard (a different one each sweep) is watched for a slice."""
        if len(wake_keys) > 1 and is_cluster(self.redis):
            wake_keys, remaining = wake_keys[:1], min(remaining, CLUSTER_WAIT_SLICE_S)
        self.redis.blpop(wake_keys, timeout=max(0.01, min(remaining, 5)))

    @translate_errors
    def ack(self, delivery):
        tag, m = delivery.source, delivery.message
        self._script('ack')(
            keys=[
                self._processing(tag, m.queue_name, delivery.consumer_id),
                self._marker(tag, m),
                self._key(tag, 'running'),
            ]
            + self._wakes(tag),
            args=[delivery.raw, m.user_key, self.max_running_per_user],
        )

    @translate_errors
    def ack_many(self, deliveries):
        """One script per shard and processing list the deliveries came from (one round trip
        with one shard)."""
        groups = {}
        for d in deliveries:
            groups.setdefault((d.source, d.message.queue_name, d.consumer_id), []).append(d)
        for (tag, queue_name, consumer_id), group in groups.items():
            wakes = self._wakes(tag)
            keys = [self._processing(tag, queue_name, consumer_id), self._key(tag, 'running')]
            keys += wakes
            args = [self.max_running_per_user, len(wakes)]
            for d in group:
                keys.append(self._marker(tag, d.message))
                args += [d.raw, d.message.user_key]
            self._script('ack_many')(keys=keys, args=args)

    @translate_errors
    def release(self, delivery):
        m, tag = delivery.message, delivery.source
        band = self._bands(tag, m.queue_name)[band_of(m.priority)]
        self._script('release')(
            keys=[
                self._processing(tag, m.queue_name, delivery.consumer_id),
                band,
                band + ':users',
                self._key(tag, 'seq'),
                self._key(tag, 'running'),
            ]
            + self._wakes(tag),
            args=[delivery.raw, m.user_key],
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
        """Every shard, those beyond the configured count included, every queue of each; then
        each shard's running counts are counted again from its live consumers' processing
        lists."""
        moved, alive = 0, {}
        for tag in self._all_tags():
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
            for queue_name in QUEUE_NAMES:
                keys = [
                    self._processing(tag, queue_name, consumer_id),
                    self._key(tag, 'seq'),
                    self._key(tag, 'running'),
                ]
                keys += self._band_keys(tag, queue_name, 'users') + self._wakes(tag)
                moved += int(self._script('recover')(keys=keys, args=[BANDS]))
            self.redis.srem(consumers_key, consumer_id)
        if self.max_running_per_user:
            # Only the cap reads the running counts: without one, no pass pays for the rebuild
            # (a cap set later is exact again from its first reaper pass on).
            self._script('recount')(
                keys=[self._key(tag, 'running'), consumers_key],
                args=[self._processing(tag, queue_name, '') for queue_name in QUEUE_NAMES],
            )
        return moved

    @translate_errors
    def running(self, user_key):
        """Messages of this user held in consumers' processing lists, over every queue (what
        the running cap counts)."""
        pipe = self.redis.pipeline(transaction=False)
        for tag in self._all_tags():
            pipe.hget(self._key(tag, 'running'), user_key)
        return sum(int(n or 0) for n in pipe.execute())

    @translate_errors
    def has_entry(self, message):
        """Its marker in its shard, or in any other registered shard (a process with another
        shard count may have pushed it)."""
        tags = [self.tag_of(message)]
        tags += [t for t in self._all_tags() if t != tags[0]]
        pipe = self.redis.pipeline(transaction=False)
        for tag in tags:
            pipe.exists(self._marker(tag, message))
        return any(pipe.execute())

    @translate_errors
    def signal_cancel(self, job_id, ttl_s=300):
        # The flag first: a worker that sees the count move finds it.
        self.redis.set(self.cancel_key(job_id), '1', ex=ttl_s)
        self.redis.incr(self._cancels_sent_key())

    @translate_errors
    def cancel_signals_sent(self):
        return int(self.redis.get(self._cancels_sent_key()) or 0)

    def _cancels_sent_key(self):
        return '%s:job:cancels-sent' % self.prefix

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
        """A write where the queues live: a short-lived key SET in every configured shard (on a
        cluster, the node of each shard's slot), so a read-only replica, a lost master or an
        unreachable shard fails. A single-server URL that names a cluster node is the wrong
        node: its keys of other slots would be MOVED."""
        client = self.redis
        if not is_cluster(client) and client.info('cluster').get('cluster_enabled'):
            raise QueueUnavailableError('redis: a cluster node behind a single-server URL')
        pipe = client.pipeline(transaction=False)
        for tag in self.shard_tags():
            pipe.set(self._key(tag, 'ready'), '1', px=READY_KEY_TTL_MS)
        pipe.execute()

    @translate_errors
    def depth(self, queue_name):
        return sum(self._waiting(tag, queue_name) for tag in self._all_tags())

    @translate_errors
    def in_flight(self, queue_name):
        processing = []
        for tag in self._all_tags():
            for consumer_id in self.redis.smembers(self._key(tag, 'consumers')):
                processing.append(self._processing(tag, queue_name, consumer_id))
        return sum(self._lengths(processing))

    @translate_errors
    def shard_lengths(self, queue_name):
        tags = self._all_tags()
        processing = {}
        for tag in tags:
            consumers = self.redis.smembers(self._key(tag, 'consumers'))
            processing[tag] = [self._processing(tag, queue_name, c) for c in consumers]
        lengths = iter(self._lengths([key for tag in tags for key in processing[tag]]))
        waiting = {tag: self._waiting(tag, queue_name) for tag in tags}
        return {tag: (waiting[tag], sum(next(lengths) for _ in processing[tag])) for tag in tags}

    @translate_errors
    def consumers(self):
        """Every consumer registered on any shard, kept if its heartbeat key lives."""
        known = set()
        for tag in self._all_tags():
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
