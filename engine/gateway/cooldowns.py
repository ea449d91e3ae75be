"""Cooldowns shared by every worker process: a provider/model that keeps failing, or that
answered 429 with Retry-After, is skipped by every worker until its cooldown ends, so queued
jobs do not each discover an outage (docs/architecture.md, decision 17).

The rule, per route entry (``provider/model``), with LiteLLM's router defaults (3 failures,
60 s): AIJOB_COOLDOWN_FAILURES failed calls within AIJOB_COOLDOWN_WINDOW_MS, with no success
between them, start a cooldown of AIJOB_COOLDOWN_MS; a 429 with Retry-After starts one at once,
as long as it asks. A failure is an outage's: a timeout, a refused connection, a 5xx or a 429;
a bad request, a refused key or malformed output says nothing of the provider's health.

Once an entry has failed, its calls until the next success are *probes*: at most as many may be
in flight as failures are still allowed, so that workers calling at the same moment cannot send
a down provider more calls than the threshold before the cooldown starts. A success ends the
suspicion (every call goes again); a worker that dies with a probe in flight leaks it only
until the window ends.

State lives in Redis when the runtime has it (one hash per entry, every key under the prefix's
``{gateway}`` hash tag, each change one Lua script, timed by the Redis server's clock), else in
the process (the embedded default)."""

import logging
import threading
import time

from prometheus_client.core import GaugeMetricFamily

from ..core.logs import log_event
from ..execution.providers import CallGuard, EntryUnavailable

# How long a call waits when an entry's probes are all in flight (it moves to the next entry,
# or the job is deferred this long).
PROBE_WAIT_MS = 1000
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

# acquire: KEYS[1] the entry's hash; ARGV threshold, window_ms, probe_wait_ms.
# Returns {1, 0} go, {2, 0} go as a probe, {0, wait_ms} skip.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'until', 'fails', 'since', 'probes')
local untl = tonumber(h[1]) or 0
if untl > now then return {0, untl - now} end
local fails = tonumber(h[2]) or 0
if fails == 0 then return {1, 0} end
if now - (tonumber(h[3]) or 0) >= tonumber(ARGV[2]) then
  redis.call('HDEL', KEYS[1], 'fails', 'since', 'probes')
  return {1, 0}
end
if fails + (tonumber(h[4]) or 0) >= tonumber(ARGV[1]) then return {0, tonumber(ARGV[3])} end
redis.call('HINCRBY', KEYS[1], 'probes', 1)
return {2, 0}
"""

# report: KEYS[1] the entry's hash; ARGV outcome (0 answered, 1 failed, 2 none: no call was
# made), probe (0/1), retry_after_ms (0: none), threshold, window_ms, cooldown_ms. Returns the
# cooldown left in ms (0: none).
_REPORT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'until', 'fails', 'since', 'probes')
local untl = tonumber(h[1]) or 0
if ARGV[2] == '1' and (tonumber(h[4]) or 0) > 0 then
  redis.call('HINCRBY', KEYS[1], 'probes', -1)
end
if ARGV[1] == '2' then return 0 end
if ARGV[1] == '0' then
  redis.call('HDEL', KEYS[1], 'fails', 'since', 'probes')
  return 0
end
if untl > now then return untl - now end
local cooldown = 0
local retry_after = tonumber(ARGV[3])
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
  redis.call('HSET', KEYS[1], 'until', now + cooldown)
  redis.call('HDEL', KEYS[1], 'fails', 'since', 'probes')
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
    def __init__(self, failures=3, window_ms=60000, cooldown_ms=60000):
        self.failures = failures
        self.window_ms = window_ms
        self.cooldown_ms = cooldown_ms

    @classmethod
    def from_config(cls, config):
        return cls(config.cooldown_failures, config.cooldown_window_ms, config.cooldown_ms)


class MemoryCooldowns:
    """The state in this process, for the embedded default (one process runs every worker)."""

    def __init__(self, policy, clock=time.monotonic):
        self.policy = policy
        self._clock = clock
        self._state = {}  # entry -> {'until', 'fails', 'since', 'probes'} in ms
        self._lock = threading.Lock()

    def _now(self):
        return int(self._clock() * 1000)

    def acquire(self, entry):
        """(go, probe, wait_s): may a call go to ``entry`` now, does it go as a probe, and how
        long a skipped call should wait."""
        with self._lock:
            now, state = self._now(), self._state.setdefault(entry, {})
            if state.get('until', 0) > now:
                return False, False, (state['until'] - now) / 1000.0
            if not state.get('fails'):
                return True, False, 0.0
            if now - state['since'] >= self.policy.window_ms:
                state.update(fails=0, probes=0)
                return True, False, 0.0
            if state['fails'] + state.get('probes', 0) >= self.policy.failures:
                return False, False, PROBE_WAIT_MS / 1000.0
            state['probes'] = state.get('probes', 0) + 1
            return True, True, 0.0

    def report(self, entry, outcome, probe, retry_after_s=None):
        """A call to ``entry`` ended (``outcome``: ANSWERED, FAILED or NO_CALL); returns the
        cooldown it started or found, in seconds."""
        with self._lock:
            now, state = self._now(), self._state.setdefault(entry, {})
            if probe and state.get('probes', 0) > 0:
                state['probes'] -= 1
            if outcome == NO_CALL:
                return 0.0
            if outcome == ANSWERED:
                state.update(fails=0, probes=0)
                return 0.0
            if state.get('until', 0) > now:
                return (state['until'] - now) / 1000.0
            if not state.get('fails') or now - state['since'] >= self.policy.window_ms:
                state.update(fails=1, since=now)
            else:
                state['fails'] += 1
            cooldown = self.policy.cooldown_ms if state['fails'] >= self.policy.failures else 0
            cooldown = max(cooldown, int((retry_after_s or 0) * 1000))
            if cooldown:
                state.update(until=now + cooldown, fails=0, probes=0)
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

    def _script(self, name):
        if self._scripts is None:
            self._scripts = {
                'acquire': self._client.register_script(_ACQUIRE),
                'report': self._client.register_script(_REPORT),
                'remaining': self._client.register_script(_REMAINING),
            }
        return self._scripts[name]

    def acquire(self, entry):
        p = self.policy
        try:
            verdict, wait_ms = self._script('acquire')(
                keys=[self.key(entry)], args=[p.failures, p.window_ms, PROBE_WAIT_MS]
            )
        except Exception as exc:  # noqa: BLE001 - any Redis failure: the call goes
            self._unreachable(exc)
            return True, False, 0.0
        return int(verdict) != 0, int(verdict) == 2, int(wait_ms) / 1000.0

    def report(self, entry, outcome, probe, retry_after_s=None):
        p = self.policy
        args = [
            outcome,
            int(bool(probe)),
            int((retry_after_s or 0) * 1000),
            p.failures,
            p.window_ms,
            p.cooldown_ms,
        ]
        try:
            left_ms = self._script('report')(keys=[self.key(entry)], args=args)
        except Exception as exc:  # noqa: BLE001
            self._unreachable(exc)
            return 0.0
        return int(left_ms) / 1000.0

    def remaining(self, entries):
        entries = list(entries)
        if not entries:
            return {}
        try:
            left = self._script('remaining')(keys=[self.key(e) for e in entries], args=[])
        except Exception as exc:  # noqa: BLE001
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
    cooldown), ``after`` reports how the call went. Calls of unrouted providers (the synthetic
    one, a plugin's) pass untouched."""

    name = 'cooldowns'

    def __init__(self, cooldowns):
        self.cooldowns = cooldowns

    def before(self, call):
        if 'route' not in call.notes:
            return None
        go, probe, wait_s = self.cooldowns.acquire(call.entry_key)
        if not go:
            raise EntryUnavailable(
                wait_s, 'cooldown', {'entry': call.entry_key, 'errorCode': COOLDOWN_CODE}
            )
        call.notes[self.name] = probe
        return None

    def after(self, call, usage, failure):
        if self.name not in call.notes:
            return
        probe = call.notes.pop(self.name)
        outcome = outcome_of(call, failure)
        if outcome == NO_CALL and not probe:
            return  # nothing to count, nothing to free
        retry_after = None
        if outcome == FAILED and failure.code == 'PROVIDER_RATE_LIMITED':
            retry_after = failure.retry_after_s
        left_s = self.cooldowns.report(call.entry_key, outcome, probe, retry_after)
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
