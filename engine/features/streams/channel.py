"""Where the live text of running jobs waits for the web tier (docs/architecture.md, decision
15): a capped Redis stream per job that expires, or, on the embedded default, a list in the
process. The worker's pump (pump.py) writes; the web processes' streams read.

A job's channel holds entries in order: ``text`` (attempt, offset, text) and ``reset`` (a new
attempt begins: a retry, a fallback, a takeover). Attempt numbers come from a counter per job
kept beside its entries, so two workers never give the same number twice. Entry ids are opaque
to everyone but the channel (Redis stream ids, or whole numbers); a reader passes back the last
one it read. Nothing here is durable, and nothing here is ever logged or written to the database:
a reader that finds the beginning trimmed or expired sees it by the offsets.
"""

import collections
import threading
import time
from dataclasses import dataclass

from ...dispatch.redis_client import connect, translate_errors

TEXT, RESET = 'text', 'reset'
# A job's attempt counter outlives its text: a retry after a long backoff, once the text has
# expired, must still get a new number (a client may hold a position in the old attempt).
COUNTER_TTL_MS = 24 * 3600 * 1000
READ_COUNT = 200  # entries per job per read of the waiting loop (only the last id is kept)

# Appends each message of one pump round to its job's stream and renews the stream's expiry, in
# one call; a message whose attempt is '' begins the job's next attempt first (its counter
# incremented, a reset entry from the second on), so a call's first text costs no round trip of
# its own. *Why a script:* redis-py's pipeline cost ~25-45 µs of the worker's CPU per command
# (an XADD and a PEXPIRE per message), so a round of 2 000 messages held the worker's one core
# for 50-90 ms without a switch, and every stream's reading waited behind it (issue 34); packing
# one command of 3 arguments per message costs ~6 µs. The keys share the ``{text}`` hash tag,
# so the script runs on a Redis Cluster too.
# KEYS: per message, its stream and its attempt counter. ARGV: the cap, the stream's TTL and
# the counter's in ms, then per message its attempt ('' to begin one), offset and text.
# Returns each message's attempt number.
_APPEND = """
local cap, ttl, counter_ttl = ARGV[1], ARGV[2], ARGV[3]
local numbers = {}
for i = 1, #KEYS / 2 do
  local stream, at = KEYS[2 * i - 1], 1 + 3 * i
  local attempt = ARGV[at]
  if attempt == '' then
    attempt = redis.call('INCR', KEYS[2 * i])
    redis.call('PEXPIRE', KEYS[2 * i], counter_ttl)
    if attempt > 1 then
      redis.call('XADD', stream, 'MAXLEN', '~', cap, '*', 'k', 'r', 'a', attempt)
    end
  end
  redis.call('XADD', stream, 'MAXLEN', '~', cap, '*',
             'k', 't', 'a', attempt, 'o', ARGV[at + 1], 't', ARGV[at + 2])
  redis.call('PEXPIRE', stream, ttl)
  numbers[i] = tonumber(attempt)
end
return numbers
"""


@dataclass(frozen=True)
class TextEntry:
    id: object  # the channel's own id of the entry
    kind: str  # TEXT or RESET
    attempt: int
    offset: int = 0
    text: str = ''


def open_text_channel(config):
    """A Redis stream per job when AIJOB_REDIS_URL is set, else the in-process channel."""
    ttl_ms, most = config.stream_text_ttl_ms, config.stream_text_max_messages
    if config.redis_url:
        return RedisTextChannel(config.redis_url, config.redis_prefix, ttl_ms, most)
    return MemoryTextChannel(ttl_ms, most)


class MemoryTextChannel:
    """The embedded default: the web tier and the worker share the process (``serve``)."""

    def __init__(self, ttl_ms, max_entries, clock=time.monotonic):
        self.ttl_s = ttl_ms / 1000.0
        self.max_entries = max_entries
        self._clock = clock
        self._cond = threading.Condition()
        self._jobs = collections.OrderedDict()  # job id -> _Log, least recently written first
        self._attempts = collections.OrderedDict()  # job id -> (last attempt, expires at)

    def _begin(self, job_id):
        """The job's next attempt number, announced by a reset from the second on."""
        number = self._next_attempt(job_id)
        if number > 1:
            self._log(job_id).add(RESET, number, 0, '')
        return number

    def _next_attempt(self, job_id):
        now = self._clock()
        _drop_expired(self._attempts, now, lambda item: item[1])
        number = self._attempts.pop(job_id, (0, 0.0))[0] + 1
        self._attempts[job_id] = (number, now + max(self.ttl_s, COUNTER_TTL_MS / 1000.0))
        return number

    def append_many(self, messages):
        """Appends (job id, attempt, offset, text) messages; an attempt None begins the job's
        next attempt with that message. Returns each message's attempt number."""
        with self._cond:
            numbers = []
            for job_id, attempt, offset, text in messages:
                if attempt is None:
                    attempt = self._begin(job_id)
                self._log(job_id).add(TEXT, attempt, offset, text)
                numbers.append(attempt)
            self._cond.notify_all()
            return numbers

    def read(self, job_id, after=None):
        with self._cond:
            log = self._jobs.get(job_id)
            if log is None:
                return []
            return [entry for entry in log.entries if after is None or entry.id > after]

    def wait_new(self, cursors, timeout_s):
        """{job id: its last entry id} for the jobs of ``cursors`` ({job id: last id read, or
        None}) that have entries after it; waits up to ``timeout_s`` for one."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                found = {}
                for job_id, after in cursors.items():
                    log = self._jobs.get(job_id)
                    if log is not None and log.entries and log.entries[-1].id > (after or 0):
                        found[job_id] = log.entries[-1].id
                left = deadline - self._clock()
                if found or left <= 0:
                    return found
                self._cond.wait(left)

    def close(self):
        pass

    def _log(self, job_id):
        """The job's log, marked as just written; logs unwritten for the TTL go."""
        now = self._clock()
        _drop_expired(self._jobs, now, lambda log: log.expires_at)
        log = self._jobs.pop(job_id, None) or _Log(self.max_entries)
        log.expires_at = now + self.ttl_s
        self._jobs[job_id] = log
        return log


def _drop_expired(ordered, now, expires_at):
    """Drop the expired items at the front of ``ordered`` (least recently written first)."""
    while ordered:
        oldest_id, oldest = next(iter(ordered.items()))
        if expires_at(oldest) > now:
            return
        del ordered[oldest_id]


class _Log:
    def __init__(self, max_entries):
        self.entries = collections.deque(maxlen=max_entries)
        self.next_id = 1
        self.expires_at = 0.0

    def add(self, kind, attempt, offset, text):
        self.entries.append(TextEntry(self.next_id, kind, attempt, offset, text))
        self.next_id += 1


class RedisTextChannel:
    """A Redis stream per job, ``{prefix}:{text}:<jobId>``, capped at ``max_entries`` (MAXLEN,
    approximate) and expiring ``ttl_ms`` after its last entry, with its attempt counter beside it
    (``…:<jobId>:attempts``). Every key shares the ``{text}`` hash tag, so one XREAD waits on
    the streams of every job a web process follows, on a Redis Cluster too."""

    def __init__(self, url, prefix, ttl_ms, max_entries):
        self.url = url
        self.prefix = prefix
        self.ttl_ms = ttl_ms
        self.max_entries = max_entries
        self._client = None
        self._client_lock = threading.Lock()
        self._append = None  # the _APPEND script, registered with the client

    @property
    def redis(self):
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = connect(self.url)
        return self._client

    def key(self, job_id):
        return '%s:{text}:%s' % (self.prefix, job_id)

    def _job_of(self, key):
        return key[len(self.prefix) + len(':{text}:') :]

    @translate_errors
    def append_many(self, messages):
        """As MemoryTextChannel.append_many: one script call (``_APPEND``)."""
        if not messages:
            return []
        if self._append is None:
            self._append = self.redis.register_script(_APPEND)
        keys = []
        args = [self.max_entries, self.ttl_ms, max(self.ttl_ms, COUNTER_TTL_MS)]
        for job_id, attempt, offset, text in messages:
            key = self.key(job_id)
            keys += (key, key + ':attempts')
            args += ('' if attempt is None else attempt, offset, text)
        return self._append(keys=keys, args=args)

    @translate_errors
    def read(self, job_id, after=None):
        low = '-' if after is None else '(' + after
        entries = self.redis.xrange(self.key(job_id), low)
        return [_entry(entry_id, fields) for entry_id, fields in entries]

    @translate_errors
    def wait_new(self, cursors, timeout_s):
        """As MemoryTextChannel.wait_new: one XREAD, blocking at most ``timeout_s``, over every
        job's stream."""
        streams = {self.key(job_id): after or '0-0' for job_id, after in cursors.items()}
        block_ms = max(1, int(timeout_s * 1000))
        answer = self.redis.xread(streams, count=READ_COUNT, block=block_ms) or []
        return {self._job_of(key): entries[-1][0] for key, entries in answer if entries}

    def close(self):
        if self._client is not None:
            self._client.close()


def _entry(entry_id, fields):
    if fields.get('k') == 'r':
        return TextEntry(entry_id, RESET, int(fields['a']))
    return TextEntry(entry_id, TEXT, int(fields['a']), int(fields['o']), fields.get('t', ''))
