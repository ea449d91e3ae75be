"""Rate limits per provider/model, held by every worker together (issue 21 item 4, issue 31 item
4; architecture decision 17, "Rate limits").

Before each call the guard reserves one request and the call's estimated tokens (the prompt
estimate plus the request's ``max_tokens``) in the entry's log: in Redis, one Lua script shared by
every worker process (keys under the runtime's prefix, with one hash tag per entry so a Redis
Cluster keeps them on one slot), or in the process on the embedded default. After the call it
settles the tokens with the reported usage.

Exactness: a request counts from its reservation until one window after its response (until
one window after its call's deadline while no response has come: a worker that dies mid-call
leaks nothing longer). The provider receives the request between those two moments, so any
``limit + 1`` requests it counts in one window would all have been counted at once here, which
the log never allows: the limit holds whatever the delay between the reservation and the
provider, with no margin to guess.

A call the log has no room for is *booked*: it takes the next place in the entry's queue and is
given the earliest time it could fit (every request counted leaves no earlier than one window
after now or after its response, every booking ahead no earlier than one window after its own
time). With no other route entry to try, the job is deferred until then (JobDeferred, holding no
worker thread and spending no retry). When it comes back it goes as soon as the requests counted
plus the bookings ahead of it leave room for it; if not yet, it keeps its place and is told the
new earliest time. A place is kept however late its job comes back within a window (LATE_MS at
least) of the last time it was given, so no job is re-deferred forever, and 500 waiting jobs wake
one place at a time instead of racing for each opening. A place whose job has not come back by
then lapses: a cancelled job's place, or one whose call went to another entry, holds no room
longer (a job that comes back later still queues again, once). Where
the route has another entry the call is not booked: it moves on (EntryUnavailable) and the
entry's queue is not held up.
"""

import logging
import threading
import time
from dataclasses import dataclass

from ...core.errors import JobDeferred
from ...core.logs import log_event
from ...execution.providers import CallGuard, EntryUnavailable

RATE_LIMIT = 'rate_limit'  # the reason a deferral or an unavailable entry names
# The limiter itself cannot be reached (Redis down): the job waits this long and tries again
# rather than call a provider without knowing its limit.
UNAVAILABLE_DELAY_S = 1.0
# Old entries dropped per step of the script (Lua's unpack has a bound on its arguments).
_TRIM_BATCH = 500
# A booked place lapses when its job has not come back within a window of the time it was last
# given, and never sooner than this: a wake-up seconds late (a loaded machine, a worker's
# restart) keeps its place. One much later (its process died and another's dispatcher pushed it)
# queues again, once.
LATE_MS = 10_000


@dataclass(frozen=True)
class Slot:
    """What a reservation answered: ``wait_ms`` 0 and the ``member`` naming the request in the
    log (to settle or release it), or the wait until the call could fit."""

    wait_ms: int
    member: str = ''


def earliest(leaving, now, over_requests, over_tokens):
    """The earliest time a call fits: ``leaving`` holds (the earliest time it leaves, tokens) of
    everything counted or booked ahead; ``over_requests`` and ``over_tokens`` say how much of it
    must leave first."""
    at = now
    for leaves_at, tokens in sorted(leaving):
        if over_requests <= 0 and over_tokens <= 0:
            break
        at = leaves_at
        over_requests, over_tokens = over_requests - 1, over_tokens - tokens
    return at


# ---------------------------------------------------------------- the shared log (Redis)
# KEYS: counted (zset: request -> the time it stops counting, ms), queue (zset: booked member ->
# the time it was first given, so in booking order), lapse (zset: booked member -> the time its
# place lapses), weights (hash: request or booked member -> tokens; '#sum' -> the counted total).
# ARGV: member, tokens, rpm (0: none), tpm (0: none), window ms, hold ms (the call's deadline),
# book ('1': book the member's place when it does not fit), late ms (how late a place is kept).
# Returns {wait ms, request}: wait 0 and the name of the request counted, else the wait.
# The same rules as LocalWindow.reserve, which reads more easily.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, tokens = ARGV[1], tonumber(ARGV[2])
local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local window, hold, book = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local late = tonumber(ARGV[8])
local counted, queue, lapse, weights = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local batch = %(batch)d

-- the running total of counted tokens ('-0', Lua's negative zero, is no integer to Redis)
local function add(n)
  if n ~= 0 then redis.call('HINCRBY', weights, '#sum', n) end
end

-- the tokens of names, read in batches (unpack has a bound on its arguments)
local function tokens_of(names)
  local found = {}
  for i = 1, #names, batch do
    local part = {}
    for j = i, math.min(i + batch - 1, #names) do part[#part + 1] = names[j] end
    local w = redis.call('HMGET', weights, unpack(part))
    for j = 1, #part do found[#found + 1] = tonumber(w[j]) or 0 end
  end
  return found
end

local function drop(key, names)
  local gone = 0
  for _, n in ipairs(tokens_of(names)) do gone = gone + n end
  redis.call('ZREM', key, unpack(names))
  redis.call('HDEL', weights, unpack(names))
  return gone
end

while true do
  local old = redis.call('ZRANGEBYSCORE', counted, '-inf', now, 'LIMIT', 0, batch)
  if #old == 0 then break end
  add(-drop(counted, old))
end
while true do
  local old = redis.call('ZRANGEBYSCORE', lapse, '-inf', now, 'LIMIT', 0, batch)
  if #old == 0 then break end
  redis.call('ZREM', queue, unpack(old))
  drop(lapse, old)
end

-- the keys live until the last request leaves and the last booking lapses
local function keep()
  local last = redis.call('ZRANGE', counted, -1, -1, 'WITHSCORES')
  local until_ms = tonumber(last[2]) or now
  last = redis.call('ZREVRANGE', lapse, 0, 0, 'WITHSCORES')
  if last[2] then until_ms = math.max(until_ms, tonumber(last[2])) end
  for _, key in ipairs({counted, queue, lapse, weights}) do
    redis.call('PEXPIRE', key, math.max(0, until_ms - now) + 1000)
  end
end

local rank = redis.call('ZRANK', queue, member)
local ahead = rank or redis.call('ZCARD', queue)
local booked, booked_at = {}, {}
if ahead > 0 then
  local page = redis.call('ZRANGE', queue, 0, ahead - 1, 'WITHSCORES')
  for i = 1, #page, 2 do
    booked[#booked + 1] = page[i]
    booked_at[#booked_at + 1] = tonumber(page[i + 1])
  end
end
local booked_tokens = tokens_of(booked)
local ahead_tokens = 0
for _, n in ipairs(booked_tokens) do ahead_tokens = ahead_tokens + n end
local count = redis.call('ZCARD', counted)
local sum = tonumber(redis.call('HGET', weights, '#sum')) or 0
local over_requests, over_tokens = 0, 0
if rpm > 0 then over_requests = count + ahead + 1 - rpm end
if tpm > 0 then over_tokens = sum + ahead_tokens + tokens - tpm end

if over_requests <= 0 and over_tokens <= 0 then
  if rank then
    redis.call('ZREM', queue, member)
    redis.call('ZREM', lapse, member)
    redis.call('HDEL', weights, member)
  end
  local name = member .. '@' .. now
  redis.call('ZADD', counted, now + hold + window, name)
  redis.call('HSET', weights, name, tokens)
  add(tokens)
  keep()
  return {0, name}
end

-- the earliest it fits: a request counted leaves no earlier than a window from now (or from
-- its response), a booking ahead no earlier than a window after its time
local leaving = {}
local all = redis.call('ZRANGE', counted, 0, -1, 'WITHSCORES')
local names = {}
for i = 1, #all, 2 do names[#names + 1] = all[i] end
local counted_tokens = tokens_of(names)
for i = 1, #names do
  leaving[#leaving + 1] = {math.min(tonumber(all[2 * i]), now + window), counted_tokens[i]}
end
for i = 1, #booked do
  leaving[#leaving + 1] = {math.max(booked_at[i], now) + window, booked_tokens[i]}
end
table.sort(leaving, function(a, b) return a[1] < b[1] end)
local at = now
for _, l in ipairs(leaving) do
  if over_requests <= 0 and over_tokens <= 0 then break end
  at = l[1]
  over_requests, over_tokens = over_requests - 1, over_tokens - l[2]
end
if book and not rank then
  -- its place: after every booking (a later time, so the queue's order is the booking order)
  if #booked_at > 0 then at = math.max(at, booked_at[#booked_at] + 1) end
  redis.call('ZADD', queue, at, member)
  redis.call('HSET', weights, member, tokens)
end
if rank or book then
  redis.call('ZADD', lapse, at + math.max(window, late), member)  -- kept while it comes back
  keep()
end
return {math.max(1, at - now), ''}
""" % {'batch': _TRIM_BATCH}

# KEYS: counted, weights. ARGV: request, tokens used ('': the estimate stands), window ms,
# 'release' (the request was not made: it stops counting now) or 'answered' (it counts one
# window more from now).
_SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local change = 0
if ARGV[4] == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  change = -tonumber(old)
else
  -- a window from now, and the millisecond now is in (TIME is read to the millisecond below)
  redis.call('ZADD', KEYS[1], now + 1 + tonumber(ARGV[3]), ARGV[1])
  if ARGV[2] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    change = tonumber(ARGV[2]) - tonumber(old)
  end
end
if change ~= 0 then redis.call('HINCRBY', KEYS[2], '#sum', change) end
return 1
"""


class RedisWindow:
    """The log and queue of each entry in Redis, shared by every process. ``client`` is the
    runtime's Redis client, or a function returning it (built at first use, as the queue's
    is)."""

    def __init__(self, client, prefix, window_ms, late_ms=LATE_MS):
        self._client = client
        self.prefix = prefix
        self.window_ms = window_ms
        self.late_ms = late_ms
        self._scripts = None
        self._lock = threading.Lock()

    def _script(self, name):
        if self._scripts is None:
            with self._lock:
                if self._scripts is None:
                    client = self._client() if callable(self._client) else self._client
                    self._scripts = {
                        'reserve': client.register_script(_RESERVE),
                        'settle': client.register_script(_SETTLE),
                    }
        return self._scripts[name]

    def keys(self, entry):
        """One hash tag per entry: every key on one Cluster slot, as the scripts need."""
        tag = 'rl:' + entry.replace('{', '(').replace('}', ')')
        # (not the ':log' and ':tokens' of the log before issue 31: a worker of that version
        # and one of this never read each other's keys as their own)
        parts = ('counted', 'queue', 'lapse', 'weights')
        return ['%s:{%s}:%s' % (self.prefix, tag, part) for part in parts]

    def reserve(self, entry, member, tokens, limits, book, hold_ms):
        args = [
            member,
            int(tokens),
            limits.rpm or 0,
            limits.tpm or 0,
            self.window_ms,
            int(hold_ms),
            '1' if book else '0',
            self.late_ms,
        ]
        wait_ms, name = self._script('reserve')(keys=self.keys(entry), args=args)
        return Slot(int(wait_ms), _text(name))

    def settle(self, entry, member, tokens=None):
        self._finish(entry, member, '' if tokens is None else int(tokens), 'answered')

    def release(self, entry, member):
        self._finish(entry, member, '', 'release')

    def _finish(self, entry, member, tokens, how):
        counted, _, _, weights = self.keys(entry)
        args = [member, tokens, self.window_ms, how]
        self._script('settle')(keys=[counted, weights], args=args)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------- in the process
class _Log:
    def __init__(self):
        self.counted = {}  # request -> [the time it stops counting (ms), tokens]
        # [the time first given (ms), member, tokens, the time it lapses] of each booking, in
        # booking order
        self.queue = []
        self.total = 0  # the counted tokens


class LocalWindow:
    """The same log, queue and rules in the process (the embedded default: one process runs
    every worker), under one lock."""

    def __init__(self, window_ms, late_ms=LATE_MS, clock=time.monotonic):
        self.window_ms = window_ms
        self.late_ms = late_ms
        self._clock = clock
        self._logs = {}
        self._lock = threading.Lock()

    def _now(self):
        return int(self._clock() * 1000)

    def reserve(self, entry, member, tokens, limits, book, hold_ms):
        with self._lock:
            now = self._now()
            log = self._logs.setdefault(entry, _Log())
            self._trim(log, now)
            places = [booking[1] for booking in log.queue]
            rank = places.index(member) if member in places else None
            ahead = log.queue[: len(log.queue) if rank is None else rank]
            over_requests = len(log.counted) + len(ahead) + 1 - limits.rpm if limits.rpm else 0
            ahead_tokens = sum(booking[2] for booking in ahead)
            over_tokens = log.total + ahead_tokens + tokens - limits.tpm if limits.tpm else 0
            if over_requests <= 0 and over_tokens <= 0:
                if rank is not None:
                    del log.queue[rank]
                name = '%s@%d' % (member, now)
                log.counted[name] = [now + hold_ms + self.window_ms, tokens]
                log.total += tokens
                return Slot(0, name)
            leaving = [(min(end, now + self.window_ms), n) for end, n in log.counted.values()]
            leaving += [(max(at, now) + self.window_ms, n) for at, _, n, _ in ahead]
            at = earliest(leaving, now, over_requests, over_tokens)
            if book and rank is None:
                if ahead:  # its place: after every booking, so time order is booking order
                    at = max(at, ahead[-1][0] + 1)
                log.queue.append([at, member, tokens, 0])
                rank = len(log.queue) - 1
            if rank is not None:  # kept while it comes back
                log.queue[rank][3] = at + max(self.window_ms, self.late_ms)
            return Slot(max(1, at - now))

    def _trim(self, log, now):
        for name in [name for name, (end, _) in log.counted.items() if end <= now]:
            log.total -= log.counted.pop(name)[1]
        log.queue = [booking for booking in log.queue if booking[3] > now]

    def settle(self, entry, member, tokens=None):
        with self._lock:
            request = self._logs.get(entry, _Log()).counted.get(member)
            if request is None:
                return
            # It counts a window more from now (from the end of the millisecond now is in, as
            # the clock is read to the millisecond below).
            request[0] = self._now() + 1 + self.window_ms
            if tokens is not None:
                self._logs[entry].total += tokens - request[1]
                request[1] = tokens

    def release(self, entry, member):
        with self._lock:
            log = self._logs.get(entry)
            if log is not None and member in log.counted:
                log.total -= log.counted.pop(member)[1]


# ---------------------------------------------------------------- the guard
# How long a call may last when its definition says nothing (a plugin's call in a test): its
# request counts until a window after that at most, should no response come.
DEFAULT_HOLD_MS = 600_000


class RateLimitGuard(CallGuard):
    """The CallGuard of rate limits. ``limits``: {'provider/model': Limits} of the provider
    config (a plugin's provider's among them); a call's own ``call.limits`` (the gateway's route
    entry) win over them."""

    name = 'rate_limits'

    def __init__(self, window, limits=None):
        self.window = window
        self.limits = dict(limits or {})

    @classmethod
    def from_config(cls, config, redis=None, limits=None):
        """The guard of ``limits`` (the provider config's, by entry) over
        AIJOB_RATE_LIMIT_WINDOW_MS; shared in Redis when ``redis`` (a client, or a function
        returning one) is given."""
        configured = dict(limits or {})
        window_ms = config.rate_limit_window_ms
        if redis is not None:
            window = RedisWindow(redis, config.redis_prefix, window_ms)
        else:
            window = LocalWindow(window_ms)
        return cls(window, configured)

    def limits_for(self, call):
        return call.limits or self.limits.get(call.entry_key)

    def before(self, call):
        limits = self.limits_for(call)
        if not limits:
            return None
        tokens = (call.prompt_tokens or 0) + (call.max_tokens or 0)
        if limits.tpm:
            tokens = min(tokens, limits.tpm)  # a request alone may fill the window, no more
        member = '%s:%d' % (call.job.id, call.call_no)
        book = not call.has_next_entry
        definition = call.definition
        hold_ms = definition.execution.timeout_ms if definition is not None else DEFAULT_HOLD_MS
        try:
            slot = self.window.reserve(call.entry_key, member, tokens, limits, book, hold_ms)
        except Exception as exc:  # the shared limiter is unreachable: wait, do not guess
            log_event(
                'rate_limit.unavailable',
                logging.WARNING,
                entry=call.entry_key,
                error_type=exc.__class__.__name__,
            )
            raise JobDeferred(UNAVAILABLE_DELAY_S, RATE_LIMIT, {'entry': call.entry_key}) from None
        if slot.wait_ms > 0:
            detail = {'entry': call.entry_key, 'waitMs': slot.wait_ms}
            raise EntryUnavailable(slot.wait_ms / 1000.0, RATE_LIMIT, detail)
        call.notes[self.name] = (call.entry_key, slot.member, bool(limits.tpm))
        return None

    def after(self, call, usage, failure):
        note = call.notes.pop(self.name, None)
        if note is None:
            return
        entry, member, counts_tokens = note
        try:
            if not call.sent:  # a later guard stopped it: it stops counting now
                self.window.release(entry, member)
                return
            used = None
            if counts_tokens and usage is not None:
                used = (usage.prompt_tokens or 0) + (usage.completion_tokens or 0) or None
            # Answered (or failed): it counts a window from now, with the tokens it used.
            self.window.settle(entry, member, used)
        except Exception as exc:  # it keeps counting until its deadline's window ends
            log_event(
                'rate_limit.settle_failed',
                logging.WARNING,
                entry=entry,
                error_type=exc.__class__.__name__,
            )
