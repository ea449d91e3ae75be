"""Cooldowns shared by every worker process: a provider/model that keeps failing, or that
answered 429 with Retry-After, is skipped by every worker until its cooldown ends, so queued
jobs do not each discover an outage (docs/architecture.md, decision 17).

The rule, per route entry (``provider/model``), with LiteLLM's router defaults (3 failures,
60 s): AIJOB_COOLDOWN_FAILURES failed calls within AIJOB_COOLDOWN_WINDOW_MS, with no success
between them, start a cooldown of AIJOB_COOLDOWN_MS; a 429 with Retry-After starts one at once,
as long as it asks. A failure is an outage's: a timeout, a refused connection, a 5xx or a 429;
a bad request, a refused key or malformed output says nothing of the provider's health.

While an entry cools, one call per AIJOB_COOLDOWN_PROBE_MS may go to it as a *probe* (issue 31
item 5): the first call of any worker once the interval has passed claims it (in the shared
state, so one worker only). The probe's answer ends the cooldown for every worker; its failure
keeps the cooldown and starts the interval again. So a provider back after a few seconds is used
again within one interval, not after the whole cooldown, and an outage costs the threshold's
failures plus one probe per interval. Calls skipped while a probe is out wait about as long as it
has been out (a tenth of a second at least, an interval at most), so they follow a quick answer
closely without polling a hanging probe; calls skipped otherwise wait for the next probe's time.
No probe goes before a Retry-After has passed.

Every call to an entry is counted while it is in flight (until it reports, or until its job's
deadline passes: a worker that dies mid-call leaks nothing longer). Once an entry has failed,
and until its next success, a call may go only while its failures plus the calls in flight
stay below the threshold: workers calling at the same moment cannot send a down provider more
calls than the threshold before the cooldown starts (only the calls already in flight when the
first failure comes back, which nothing could have known about, may add to them). A success
ends the suspicion.

State lives in Redis when the runtime has it (per entry a hash and a sorted set of the calls in
flight, every key under the prefix's ``{gateway}`` hash tag, each change one Lua script, timed
by the Redis server's clock), else in the process (the embedded default)."""

import itertools
import logging
import os
import threading
import time

from prometheus_client.core import GaugeMetricFamily

from ...core.logs import log_event
from ...execution.providers import CallGuard, EntryUnavailable

# How long a call waits when a failed entry has as many calls in flight as failures are still
# allowed (it moves to the next entry, or the job is deferred this long).
PROBE_WAIT_MS = 1000
# The least a call waits while a cooling entry's probe is out (it waits as long as the probe has
# been out, up to a probe interval).
PROBE_OUT_MIN_WAIT_MS = 100
ANSWERED, FAILED, NO_CALL = 0, 1, 2  # how a call ended, for ``report``
# Codes that count as the provider's failure.
OUTAGE_CODES = frozenset(
    (
        'PROVIDER_TIMEOUT',
        'PROVIDER_UNAVAILABLE',
        'PROVIDER_ERROR',
        'PROVIDER_RATE_LIMITED',
        'TIMEOUT',
    )
)
COOLDOWN_CODE = 'PROVIDER_COOLDOWN'  # the errorCode of a fallback past a cooling entry
REDIS_ERROR_LOG_EVERY_S = 10.0

# acquire: KEYS[1] the entry's hash, KEYS[2] its calls in flight; ARGV threshold, window_ms,
# probe_wait_ms, the call's id, its deadline in ms from now, probe_ms. Returns {1, 0} go (the call
# is counted in flight; during a cooldown it is the probe), {0, wait_ms} skip.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'until', 'fails', 'since', 'probe_next', 'prober',
  'probe_at', 'probe_end')
local untl = tonumber(h[1]) or 0
local ttl = tonumber(ARGV[5])
if untl > now then
  if h[5] and (tonumber(h[7]) or 0) > now then  -- a probe is out: wait about as long as it has
    local age = now - (tonumber(h[6]) or now)
    local wait = math.min(tonumber(ARGV[6]), math.max(%(out_min)d, age))
    return {0, math.min(untl - now, wait)}
  end
  local probe_next = tonumber(h[4]) or untl
  if probe_next > now then return {0, math.min(probe_next, untl) - now} end
  redis.call('HSET', KEYS[1], 'prober', ARGV[4], 'probe_at', now, 'probe_end', now + ttl)
else
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local fails = tonumber(h[2]) or 0
  if fails > 0 and now - (tonumber(h[3]) or 0) >= tonumber(ARGV[2]) then
    redis.call('HDEL', KEYS[1], 'fails', 'since')
    fails = 0
  end
  if fails > 0 and fails + redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[1]) then
    return {0, tonumber(ARGV[3])}
  end
end
redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return {1, 0}
""" % {'out_min': PROBE_OUT_MIN_WAIT_MS}

# report: KEYS[1] the entry's hash, KEYS[2] its calls in flight; ARGV outcome (0 answered,
# 1 failed, 2 none: no call was made), the call's id, retry_after_ms (0: none), threshold,
# window_ms, cooldown_ms, probe_ms. Returns the cooldown left in ms (0: none).
_REPORT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[2], ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'until', 'fails', 'since', 'prober')
local untl = tonumber(h[1]) or 0
local probed = h[4] == ARGV[2]
if probed then redis.call('HDEL', KEYS[1], 'prober', 'probe_at', 'probe_end') end
if ARGV[1] == '2' then return 0 end
if ARGV[1] == '0' then
  -- an answer ends the suspicion; the probe's ends the cooldown, for every worker
  if probed then redis.call('HDEL', KEYS[1], 'until', 'probe_next') end
  redis.call('HDEL', KEYS[1], 'fails', 'since')
  return 0
end
local retry_after = tonumber(ARGV[3])
local probe_ms = tonumber(ARGV[7])
if untl > now then
  if probed then  -- the cooldown stays; the next probe after an interval (or the Retry-After)
    if now + retry_after > untl then
      untl = now + retry_after
      redis.call('HSET', KEYS[1], 'until', untl)
      redis.call('PEXPIRE', KEYS[1], retry_after + tonumber(ARGV[5]) + 60000)
    end
    redis.call('HSET', KEYS[1], 'probe_next', now + math.max(probe_ms, retry_after))
  end
  return untl - now
end
local cooldown = 0
local fails = tonumber(h[2]) or 0
if fails == 0 or now - (tonumber(h[3]) or 0) >= tonumber(ARGV[5]) then
  fails = 1
  redis.call('HSET', KEYS[1], 'since', now)
else
  fails = fails + 1
end
if fails >= tonumber(ARGV[4]) then cooldown = tonumber(ARGV[6]) end
if retry_after > cooldown then cooldown = retry_after end
if cooldown > 0 then
  local probe_next = now + math.max(probe_ms, retry_after)
  redis.call('HSET', KEYS[1], 'until', now + cooldown, 'probe_next', probe_next)
  redis.call('HDEL', KEYS[1], 'fails', 'since', 'prober', 'probe_at', 'probe_end')
else
  redis.call('HSET', KEYS[1], 'fails', fails)
end
redis.call('PEXPIRE', KEYS[1], cooldown + tonumber(ARGV[5]) + 60000)
return cooldown
"""

# remaining: KEYS every entry's hash. Returns the ms left of each cooldown (0: none).
_REMAINING = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = {}
for i, key in ipairs(KEYS) do
  local untl = tonumber(redis.call('HGET', key, 'until')) or 0
  left[i] = math.max(0, untl - now)
end
return left
"""


class CooldownPolicy:
    def __init__(self, failures=3, window_ms=60000, cooldown_ms=60000, probe_ms=2000):
        self.failures = failures
        self.window_ms = window_ms
        self.cooldown_ms = cooldown_ms
        self.probe_ms = probe_ms

    @classmethod
    def from_config(cls, config):
        return cls(
            config.cooldown_failures,
            config.cooldown_window_ms,
            config.cooldown_ms,
            config.cooldown_probe_ms,
        )


class MemoryCooldowns:
    """The state in this process, for the embedded default (one process runs every worker)."""

    def __init__(self, policy, clock=time.monotonic):
        self.policy = policy
        self._clock = clock
        # entry -> {'until', 'fails', 'since', 'probe_next'} in ms, and 'probe': (call id, its
        # start, its deadline) of the probe out
        self._state = {}
        self._flying = {}  # entry -> {call id: its deadline in ms}
        self._lock = threading.Lock()

    def _now(self):
        return int(self._clock() * 1000)

    def acquire(self, entry, call_id, ttl_ms):
        """(go, wait_s): may call ``call_id`` go to ``entry`` now (then it counts in flight
        for at most ``ttl_ms``; during a cooldown it is the probe), and how long a skipped call
        should wait."""
        with self._lock:
            now, state = self._now(), self._state.setdefault(entry, {})
            flying = self._flying.setdefault(entry, {})
            if state.get('until', 0) > now:
                wait_ms = self._probe_wait(state, now)
                if wait_ms:
                    return False, wait_ms / 1000.0
                state['probe'] = (call_id, now, now + ttl_ms)
            else:
                for stale in [c for c, deadline in flying.items() if deadline <= now]:
                    del flying[stale]
                fails = state.get('fails', 0)
                if fails and now - state['since'] >= self.policy.window_ms:
                    state['fails'] = fails = 0
                if fails and fails + len(flying) >= self.policy.failures:
                    return False, PROBE_WAIT_MS / 1000.0
            flying[call_id] = now + ttl_ms
            return True, 0.0

    def _probe_wait(self, state, now):
        """How long a call to a cooling entry waits (ms), or 0: it goes as the probe."""
        left = state['until'] - now
        prober, started, deadline = state.get('probe') or (None, now, 0)
        if prober is not None and deadline > now:  # out: wait about as long as it has been
            return min(left, self.policy.probe_ms, max(PROBE_OUT_MIN_WAIT_MS, now - started))
        return max(0, min(left, state.get('probe_next', state['until']) - now))

    def report(self, entry, call_id, outcome, retry_after_s=None):
        """Call ``call_id`` to ``entry`` ended (``outcome``: ANSWERED, FAILED or NO_CALL);
        returns the cooldown it started or found, in seconds."""
        with self._lock:
            now, state = self._now(), self._state.setdefault(entry, {})
            self._flying.setdefault(entry, {}).pop(call_id, None)
            probed = (state.get('probe') or (None,))[0] == call_id
            if probed:
                del state['probe']
            if outcome == NO_CALL:
                return 0.0
            if outcome == ANSWERED:
                if probed:  # the provider is back: the cooldown ends for every worker
                    state.pop('until', None)
                state['fails'] = 0
                return 0.0
            retry_after_ms = int((retry_after_s or 0) * 1000)
            if state.get('until', 0) > now:
                if probed:  # it stays; the next probe after an interval (or the Retry-After)
                    state['until'] = max(state['until'], now + retry_after_ms)
                    state['probe_next'] = now + max(self.policy.probe_ms, retry_after_ms)
                return (state['until'] - now) / 1000.0
            if not state.get('fails') or now - state['since'] >= self.policy.window_ms:
                state.update(fails=1, since=now)
            else:
                state['fails'] += 1
            cooldown = self.policy.cooldown_ms if state['fails'] >= self.policy.failures else 0
            cooldown = max(cooldown, retry_after_ms)
            if cooldown:
                probe_next = now + max(self.policy.probe_ms, retry_after_ms)
                state.update(until=now + cooldown, fails=0, probe_next=probe_next)
                state.pop('probe', None)  # a probe of an earlier cooldown claims nothing now
            return cooldown / 1000.0

    def remaining(self, entries):
        """{entry: seconds of cooldown left} for ``entries`` (0.0: none)."""
        with self._lock:
            now = self._now()
            return {
                e: max(0, self._state.get(e, {}).get('until', 0) - now) / 1000.0 for e in entries
            }


class RedisCooldowns:
    """The state in Redis, shared by every worker process; each change is one Lua script.
    Redis being unreachable lets every call go (a cooldown spares a down provider calls; it
    must not stop the jobs of a healthy one), logged at most every few seconds."""

    def __init__(self, policy, client, prefix):
        self.policy = policy
        self._client = client
        self._prefix = prefix
        self._scripts = None
        self._logged_at = 0.0

    def key(self, entry):
        return '%s:{gateway}:cooldown:%s' % (self._prefix, entry)

    def flying_key(self, entry):
        return '%s:{gateway}:flying:%s' % (self._prefix, entry)

    def _script(self, name):
        if self._scripts is None:
            self._scripts = {
                'acquire': self._client.register_script(_ACQUIRE),
                'report': self._client.register_script(_REPORT),
                'remaining': self._client.register_script(_REMAINING),
            }
        return self._scripts[name]

    def acquire(self, entry, call_id, ttl_ms):
        p = self.policy
        keys = [self.key(entry), self.flying_key(entry)]
        try:
            verdict, wait_ms = self._script('acquire')(
                keys=keys,
                args=[p.failures, p.window_ms, PROBE_WAIT_MS, call_id, int(ttl_ms), p.probe_ms],
            )
        except Exception as exc:  # any Redis failure: the call goes (see the class)
            self._unreachable(exc)
            return True, 0.0
        return int(verdict) == 1, int(wait_ms) / 1000.0

    def report(self, entry, call_id, outcome, retry_after_s=None):
        p = self.policy
        args = [
            outcome,
            call_id,
            int((retry_after_s or 0) * 1000),
            p.failures,
            p.window_ms,
            p.cooldown_ms,
            p.probe_ms,
        ]
        try:
            left_ms = self._script('report')(
                keys=[self.key(entry), self.flying_key(entry)], args=args
            )
        except Exception as exc:
            self._unreachable(exc)
            return 0.0
        return int(left_ms) / 1000.0

    def remaining(self, entries):
        entries = list(entries)
        if not entries:
            return {}
        try:
            left = self._script('remaining')(keys=[self.key(e) for e in entries], args=[])
        except Exception as exc:
            self._unreachable(exc)
            return {}
        return {e: int(ms) / 1000.0 for e, ms in zip(entries, left, strict=True)}

    def _unreachable(self, exc):
        now = time.monotonic()
        if now - self._logged_at >= REDIS_ERROR_LOG_EVERY_S:
            self._logged_at = now
            log_event(
                'gateway.cooldowns_unavailable',
                logging.WARNING,
                error_type=exc.__class__.__name__,
            )


def open_cooldowns(config, redis_client):
    policy = CooldownPolicy.from_config(config)
    if redis_client is None:
        return MemoryCooldowns(policy)
    return RedisCooldowns(policy, redis_client, config.redis_prefix)


def outcome_of(call, failure):
    """How a call ended for its entry's health: FAILED for an outage's failure, NO_CALL when no
    answer came (a cancel, a deferral, a later guard's refusal), else ANSWERED (a success, a bad
    request, a refused key: the provider is up). A 429 on a user's own key is that user's limit,
    not the entry's."""
    code = getattr(failure, 'code', None)
    if not call.sent:  # a later guard refused it (a budget, a rate limit): the entry was not asked
        return NO_CALL
    if failure is None:
        return ANSWERED
    if code is None or code == 'CANCELLED':
        return NO_CALL
    if code not in OUTAGE_CODES:
        return ANSWERED
    if code == 'PROVIDER_RATE_LIMITED' and call.request.credential.mode != 'platform_key':
        return NO_CALL
    return FAILED


class CooldownGuard(CallGuard):
    """Holds the cooldowns around each routed call: ``before`` skips a cooling entry (the
    gateway moves the call to the route's next entry, or the job waits for the shortest
    cooldown) and counts the call in flight, ``after`` reports how it went. Calls of unrouted
    providers (the synthetic one, a plugin's) pass untouched."""

    name = 'cooldowns'

    def __init__(self, cooldowns):
        self.cooldowns = cooldowns
        self._ids = itertools.count()
        self._process = '%d-%s' % (os.getpid(), os.urandom(4).hex())

    def before(self, call):
        if 'route' not in call.notes:
            return None
        call_id = '%s-%d' % (self._process, next(self._ids))
        ttl_ms = call.definition.execution.timeout_ms  # no call outlives its job's deadline
        go, wait_s = self.cooldowns.acquire(call.entry_key, call_id, ttl_ms)
        if not go:
            raise EntryUnavailable(
                wait_s, 'cooldown', {'entry': call.entry_key, 'errorCode': COOLDOWN_CODE}
            )
        call.notes[self.name] = call_id
        return None

    def after(self, call, usage, failure):
        call_id = call.notes.pop(self.name, None)
        if call_id is None:
            return
        outcome = outcome_of(call, failure)
        retry_after = None
        if outcome == FAILED and failure.code == 'PROVIDER_RATE_LIMITED':
            retry_after = failure.retry_after_s
        left_s = self.cooldowns.report(call.entry_key, call_id, outcome, retry_after)
        if outcome == FAILED and left_s > 0:
            log_event(
                'gateway.cooldown',
                logging.WARNING,
                entry=call.entry_key,
                error_code=failure.code,
                cooldown_s=round(left_s, 3),
            )


def cooldown_gauge(gateway):
    """The Prometheus gauge of every configured entry's cooldown left, for a scrape."""
    family = GaugeMetricFamily(
        'aijob_provider_cooldown_seconds',
        'Seconds left of a provider/model cooldown (0: calls go to it).',
        labels=('provider', 'model'),
    )
    for entry, left in sorted(gateway.cooldown_state().items()):
        provider, model = entry.split('/', 1)
        family.add_metric([provider, model], left)
    return family
