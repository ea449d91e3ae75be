"""Named leases in the database (architecture decision 12): a row saying which process holds a
role until when. Taking, renewing and releasing are compare-and-set statements timed by the
database clock alone (decision 2), so two hosts whose clocks disagree still agree on who holds
it. A lease is an optimisation, never a guard of correctness: every write its holder makes stays
a compare-and-set of its own.
"""

import datetime
from dataclasses import dataclass

from .sql import statement

# MySQL evaluates SET assignments left to right on the new values, SQLite on the old ones:
# ``acquired_at`` reads ``holder`` before it changes.
_TAKE = statement(
    'UPDATE leader_lease SET acquired_at = CASE WHEN holder = %s THEN acquired_at ELSE {now} END, '
    'holder = %s, expires_at = {now_plus} '
    'WHERE name = %s AND (holder = %s OR expires_at < {now})'
)
_CREATE = statement(
    'INSERT INTO leader_lease (name, holder, acquired_at, expires_at) '
    'VALUES (%s, %s, {now}, {now_plus}) ON DUPLICATE KEY UPDATE name = name',
    'INSERT INTO leader_lease (name, holder, acquired_at, expires_at) '
    'VALUES (%s, %s, {now}, {now_plus}) ON CONFLICT (name) DO NOTHING',
)
_READ = statement('SELECT holder, expires_at, {now} FROM leader_lease WHERE name = %s')
_RELEASE = statement(
    'UPDATE leader_lease SET expires_at = {now_plus} WHERE name = %s AND holder = %s'
)


@dataclass(frozen=True)
class LeaseState:
    """The outcome of one attempt: do we hold it; else who does, and for how much longer."""

    held: bool
    holder: str | None = None
    remaining_ms: float = 0.0


class Lease:
    """The lease ``name`` as seen by ``holder`` (this process's instance id), ``ttl_ms`` long.
    Each method is a few autocommitted statements on the calling thread's connection."""

    def __init__(self, store, name, holder, ttl_ms):
        self.store = store
        self.name = name
        self.holder = holder
        self.ttl_ms = ttl_ms

    def take(self):
        """Renew the lease if ``holder`` has it, take it if it expired or never existed; else
        say who holds it and for how long yet. Returns a LeaseState."""
        ttl = self.store.ms_param(self.ttl_ms)
        params = (self.holder, self.holder, ttl, self.name, self.holder)
        if self.store.execute(_TAKE, params).rowcount == 1:
            return LeaseState(True, self.holder, float(self.ttl_ms))
        row = self.store.execute(_READ, (self.name,)).fetchone()
        if row is None:  # the first process ever: the row is born held by it
            if self.store.execute(_CREATE, (self.name, self.holder, ttl)).rowcount == 1:
                return LeaseState(True, self.holder, float(self.ttl_ms))
            row = self.store.execute(_READ, (self.name,)).fetchone()
        holder, expires_at, now = row
        remaining = (_as_datetime(expires_at) - _as_datetime(now)).total_seconds() * 1000.0
        return LeaseState(False, holder, max(0.0, remaining))

    def release(self):
        """Let the lease go now, if ``holder`` still has it, so another process takes it at its
        next attempt rather than after the TTL. Returns whether it had it."""
        params = (self.store.ms_param(-1), self.name, self.holder)
        return self.store.execute(_RELEASE, params).rowcount == 1

    def current(self):
        """(holder, expires_at) of the row, or None (admin and tests)."""
        row = self.store.execute(_READ, (self.name,)).fetchone()
        return None if row is None else (row[0], _as_datetime(row[1]))


def _as_datetime(value):
    """SQLite returns the clock as text."""
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    return value
