"""Rate limits per provider/model, held by every worker together (issue 21 item 4; architecture
decision 17, "Rate limits").

Before each call the guard reserves one request and the call's estimated tokens (the prompt
estimate plus the request's ``max_tokens``) in a sliding-window log of the entry: in Redis, one
Lua script shared by every worker process (keys under the runtime's prefix, with one hash tag per
entry so a Redis Cluster keeps them on one slot), or in the process on the embedded default.
After the call it settles the tokens with the reported usage.

A call the window has no room for gets a *slot*: the earliest time at which it fits behind every
slot already given out (first come, first served). With no other route entry to try, the slot is
booked for the job and the job is deferred until then (JobDeferred, holding no worker thread and
spending no retry); when it comes back it takes its booked slot. So 500 waiting jobs wake one
slot at a time instead of all at once and racing for each opening. Where the route has another
entry the slot is not booked: the call moves on (EntryUnavailable) and the entry's queue is not
held up.

Exactness: a request is counted at its slot for ``window + margin``. The margin covers the time
between the reservation and the provider receiving the request (a woken job arrives a little
after its slot; one later than half the margin gives its slot up and queues again), so the
provider, counting arrivals in its own ``window``, never sees more than the limit.
"""

import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional

from ..core.errors import ConfigError, JobDeferred
from ..core.logs import log_event
from ..execution.providers import CallGuard, EntryUnavailable

RATE_LIMIT = 'rate_limit'  # the reason a deferral or an unavailable entry names
# The limiter itself cannot be reached (Redis down): the job waits this long and tries again
# rather than call a provider without knowing its limit.
UNAVAILABLE_DELAY_S = 1.0
# Old entries dropped per step of the script (Lua's unpack has a bound on its arguments).
_TRIM_BATCH = 500


@dataclass(frozen=True)
class Limits:
    """A provider/model's limits: requests and tokens per window (None: no limit of that kind)."""

    rpm: Optional[int] = None
    tpm: Optional[int] = None

    @classmethod
    def parse(cls, name, value):
        """``{"rpm": 60, "tpm": 100000}`` (either may be left out); ValueError naming ``name``."""
        if not isinstance(value, dict) or set(value) - {'rpm', 'tpm'}:
            raise ValueError('%s: expected {"rpm": N, "tpm": N}' % name)
        for kind in ('rpm', 'tpm'):
            number = value.get(kind)
            if number is not None and (
                isinstance(number, bool) or not isinstance(number, int) or number < 1
            ):
                raise ValueError('%s: %s must be a positive integer' % (name, kind))
        return cls(value.get('rpm'), value.get('tpm'))

    def __bool__(self):
        return bool(self.rpm or self.tpm)


def limits_of(value):
    """Limits from ``call.limits`` as the gateway gives them: a Limits, an object with ``rpm`` and
    ``tpm`` attributes, a dict, or None."""
    if value is None or isinstance(value, Limits):
        return value
    if isinstance(value, dict):
        return Limits(value.get('rpm'), value.get('tpm'))
    return Limits(getattr(value, 'rpm', None), getattr(value, 'tpm', None))


@dataclass(frozen=True)
class Slot:
    """What a reservation answered: ``wait_ms`` 0 and the ``member`` naming the request in the
    log (to settle or release it), or the wait until the call's slot."""

    wait_ms: int
    member: str = ''


# ---------------------------------------------------------------- the shared log (Redis)
# KEYS: log (zset: member -> slot time, ms), weights (hash: member -> tokens, '#sum' -> total).
# ARGV: member, tokens, rpm (0: none), tpm (0: none), counted ms (window + margin), late ms,
# book ('1': book a future slot for the member).
# Returns {wait ms, member}: wait 0 and the member of the request that goes now, else the wait.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member, tokens = ARGV[1], tonumber(ARGV[2])
local rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4])
local counted, late, book = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local log, weights = KEYS[1], KEYS[2]

-- the running total of tokens ('-0', Lua's negative zero, is no integer to Redis)
local function add(n)
  if n ~= 0 then redis.call('HINCRBY', weights, '#sum', n) end
end

local function drop(members)
  if #members == 0 then return end
  local gone = 0
  local w = redis.call('HMGET', weights, unpack(members))
  for i = 1, #members do gone = gone + (tonumber(w[i]) or 0) end
  redis.call('ZREM', log, unpack(members))
  redis.call('HDEL', weights, unpack(members))
  add(-gone)
end

while true do
  local old = redis.call('ZRANGEBYSCORE', log, '-inf', now - counted, 'LIMIT', 0, %(batch)d)
  if #old == 0 then break end
  drop(old)
end

-- the keys live until the last slot given out has left its window
local function keep()
  local tail = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  local last_slot = math.max(now, tonumber(tail[2]) or now)
  redis.call('PEXPIRE', log, last_slot - now + counted + 1000)
  redis.call('PEXPIRE', weights, last_slot - now + counted + 1000)
end

local function take(at)
  local name = member .. '@' .. at
  redis.call('ZADD', log, at, name)
  redis.call('HSET', weights, name, tokens)
  add(tokens)
  return name
end

local booked = redis.call('ZSCORE', log, member)
if booked then
  booked = tonumber(booked)
  if booked > now then return {booked - now, ''} end
  if now - booked <= late then
    -- its slot: the request goes now, counted where the slot was
    local w = tonumber(redis.call('HGET', weights, member)) or 0
    redis.call('ZREM', log, member)
    redis.call('HDEL', weights, member)
    add(-w)
    local name = take(booked)
    keep()
    return {0, name}
  end
  drop({member})  -- too late for its slot: it queues again
end

local at = now
local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) > at then at = tonumber(last[2]) end
if rpm > 0 then
  local count = redis.call('ZCARD', log)
  if count >= rpm then
    local edge = redis.call('ZRANGE', log, count - rpm, count - rpm, 'WITHSCORES')
    at = math.max(at, tonumber(edge[2]) + counted)
  end
end
if tpm > 0 then
  local left = (tonumber(redis.call('HGET', weights, '#sum')) or 0) + tokens - tpm
  local start = 0
  while left > 0 do
    local page = redis.call('ZRANGE', log, start, start + 99, 'WITHSCORES')
    if #page == 0 then break end
    local w = {}
    for i = 1, #page, 2 do w[#w + 1] = page[i] end
    w = redis.call('HMGET', weights, unpack(w))
    for i = 1, #page, 2 do
      left = left - (tonumber(w[(i + 1) / 2]) or 0)
      if left <= 0 then
        at = math.max(at, tonumber(page[i + 1]) + counted)
        break
      end
    end
    start = start + 100
  end
end

if at <= now then
  local name = take(now)
  keep()
  return {0, name}
end
if book then
  redis.call('ZADD', log, at, member)
  redis.call('HSET', weights, member, tokens)
  add(tokens)
  keep()
end
return {at - now, ''}
""" % {'batch': _TRIM_BATCH}

# KEYS: log, weights. ARGV: member, tokens used ('' : release the request, it was not made).
_SETTLE = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return 0 end
local change
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  change = -tonumber(old)
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  change = tonumber(ARGV[2]) - tonumber(old)
end
if change ~= 0 then redis.call('HINCRBY', KEYS[2], '#sum', change) end
return 1
"""


class RedisWindow:
    """The sliding-window log of each entry in Redis, shared by every process. ``client`` is
    the runtime's Redis client, or a function returning it (built at first use, as the queue's
    is)."""

    def __init__(self, client, prefix, counted_ms, late_ms):
        self._client = client
        self.prefix = prefix
        self.counted_ms = counted_ms
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
        """One hash tag per entry: both keys on one Cluster slot, as the script needs."""
        tag = 'rl:' + entry.replace('{', '(').replace('}', ')')
        return ['%s:{%s}:log' % (self.prefix, tag), '%s:{%s}:tokens' % (self.prefix, tag)]

    def reserve(self, entry, member, tokens, limits, book):
        args = [
            member,
            int(tokens),
            limits.rpm or 0,
            limits.tpm or 0,
            self.counted_ms,
            self.late_ms,
            '1' if book else '0',
        ]
        wait_ms, name = self._script('reserve')(keys=self.keys(entry), args=args)
        return Slot(int(wait_ms), _text(name))

    def settle(self, entry, member, tokens):
        self._script('settle')(keys=self.keys(entry), args=[member, int(tokens)])

    def release(self, entry, member):
        self._script('settle')(keys=self.keys(entry), args=[member, ''])


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------- in the process
class _Log:
    def __init__(self):
        self.slots = []  # [slot ms, member], in slot order (slots are only ever appended)
        self.weights = {}  # member -> tokens
        self.total = 0


class LocalWindow:
    """The same log and the same rules in the process (the embedded default: one process runs
    every worker), under one lock."""

    def __init__(self, counted_ms, late_ms, clock=time.monotonic):
        self.counted_ms = counted_ms
        self.late_ms = late_ms
        self._clock = clock
        self._logs = {}
        self._lock = threading.Lock()

    def _now(self):
        return int(self._clock() * 1000)

    def reserve(self, entry, member, tokens, limits, book):
        with self._lock:
            now = self._now()
            log = self._logs.setdefault(entry, _Log())
            self._trim(log, now)
            booked = next((slot for slot, name in log.slots if name == member), None)
            if booked is not None:
                if booked > now:
                    return Slot(booked - now)
                self._drop(log, member)
                if now - booked <= self.late_ms:
                    return Slot(0, self._take(log, booked, member + '@%d' % booked, tokens))
            at = self._slot(log, now, tokens, limits)
            if at <= now:
                return Slot(0, self._take(log, now, member + '@%d' % now, tokens))
            if book:
                self._take(log, at, member, tokens)
            return Slot(at - now)

    def _slot(self, log, now, tokens, limits):
        """The earliest time the request fits, behind every slot given out."""
        at = max([now] + [slot for slot, _ in log.slots[-1:]])
        if limits.rpm and len(log.slots) >= limits.rpm:
            at = max(at, log.slots[len(log.slots) - limits.rpm][0] + self.counted_ms)
        left = log.total + tokens - (limits.tpm or 0)
        if limits.tpm and left > 0:
            for slot, name in log.slots:
                left -= log.weights[name]
                if left <= 0:
                    at = max(at, slot + self.counted_ms)
                    break
        return at

    def _trim(self, log, now):
        gone = 0
        while gone < len(log.slots) and log.slots[gone][0] <= now - self.counted_ms:
            log.total -= log.weights.pop(log.slots[gone][1])
            gone += 1
        del log.slots[:gone]

    def _take(self, log, at, name, tokens):
        """Add ``name`` at slot ``at``, keeping the slots in order (a booked slot that comes
        back goes where it was)."""
        index = len(log.slots)
        while index and log.slots[index - 1][0] > at:
            index -= 1
        log.slots.insert(index, [at, name])
        log.weights[name] = tokens
        log.total += tokens
        return name

    def _drop(self, log, member):
        if member in log.weights:
            log.total -= log.weights.pop(member)
            log.slots = [entry for entry in log.slots if entry[1] != member]

    def settle(self, entry, member, tokens):
        with self._lock:
            log = self._logs.get(entry)
            if log is not None and member in log.weights:
                log.total += tokens - log.weights[member]
                log.weights[member] = tokens

    def release(self, entry, member):
        with self._lock:
            log = self._logs.get(entry)
            if log is not None:
                self._drop(log, member)


# ---------------------------------------------------------------- the guard
class RateLimitGuard(CallGuard):
    """The CallGuard of rate limits. ``limits``: {'provider/model': Limits} from AIJOB_RATE_LIMITS;
    a call's own ``call.limits`` (the gateway's, from the provider file) win over them."""

    name = 'rate_limits'

    def __init__(self, window, limits=None, early_ms=0):
        self.window = window
        self.limits = dict(limits or {})
        # A deferred job is woken this much before its booked slot and waits out the rest in
        # its thread: the wake-up's own latency (push, pop, lock) then lands it on its slot
        # instead of after it.
        self.early_ms = early_ms

    @classmethod
    def from_config(cls, config, redis=None, limits=None):
        """The guard of AIJOB_RATE_LIMITS (plus ``limits`` from elsewhere, by entry), its
        window AIJOB_RATE_LIMIT_WINDOW_MS and margin AIJOB_RATE_LIMIT_MARGIN_MS; shared in
        Redis when ``redis`` (a client, or a function returning one) is given."""
        configured = parse_limits(config.rate_limits)
        configured.update((entry, limits_of(value)) for entry, value in (limits or {}).items())
        counted_ms = config.rate_limit_window_ms + config.rate_limit_margin_ms
        late_ms = config.rate_limit_margin_ms // 2
        if redis is not None:
            window = RedisWindow(redis, config.redis_prefix, counted_ms, late_ms)
        else:
            window = LocalWindow(counted_ms, late_ms)
        return cls(window, configured, early_ms=late_ms)

    def limits_for(self, call):
        return limits_of(call.limits) or self.limits.get(call.entry_key)

    def before(self, call):
        limits = self.limits_for(call)
        if not limits:
            return None
        tokens = (call.prompt_tokens or 0) + (call.max_tokens or 0)
        if limits.tpm:
            tokens = min(tokens, limits.tpm)  # a request alone may fill the window, no more
        member = '%s:%d' % (call.job.id, call.call_no)
        book = not call.has_next_entry
        try:
            slot = self.window.reserve(call.entry_key, member, tokens, limits, book)
            if book and 0 < slot.wait_ms <= self.early_ms:  # its slot is moments away
                time.sleep(slot.wait_ms / 1000.0)
                slot = self.window.reserve(call.entry_key, member, tokens, limits, book)
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
            wake_ms = slot.wait_ms - self.early_ms if book else slot.wait_ms
            raise EntryUnavailable(max(0, wake_ms) / 1000.0, RATE_LIMIT, detail)
        call.notes[self.name] = (call.entry_key, slot.member, bool(limits.tpm))
        return None

    def after(self, call, usage, failure):
        note = call.notes.pop(self.name, None)
        if note is None:
            return
        entry, member, counts_tokens = note
        try:
            if isinstance(failure, (EntryUnavailable, JobDeferred)):
                self.window.release(entry, member)  # a later guard stopped it: never sent
            elif counts_tokens and usage is not None:
                used = (usage.prompt_tokens or 0) + (usage.completion_tokens or 0)
                if used:
                    self.window.settle(entry, member, used)
        except Exception as exc:  # the estimate stands; it leaves the window with time
            log_event(
                'rate_limit.settle_failed',
                logging.WARNING,
                entry=entry,
                error_type=exc.__class__.__name__,
            )


def parse_limits(value):
    """AIJOB_RATE_LIMITS' JSON object ({"provider/model": {"rpm": N, "tpm": N}}) as
    {entry: Limits}; ConfigError naming the entry."""
    limits = {}
    for name, entry in (value or {}).items():
        if '/' not in name:
            raise ConfigError('AIJOB_RATE_LIMITS is invalid: %r is not "provider/model"' % name)
        try:
            limits[name] = Limits.parse(name, entry)
        except ValueError as exc:
            raise ConfigError('AIJOB_RATE_LIMITS is invalid: %s' % exc) from None
    return limits


def install_rate_limits(ai, config, store, redis, limits=None):
    """Append the rate-limit guard to ``ai.guards`` when any limit is configured (AIJOB_RATE_LIMITS
    or ``limits``, the provider file's by entry); ``redis`` (a client, a function returning one,
    or None on the embedded default) holds the shared windows. Returns the guard or None."""
    guard = RateLimitGuard.from_config(config, redis, limits)
    if not guard.limits:
        return None
    ai.guards.append(guard)
    return guard
