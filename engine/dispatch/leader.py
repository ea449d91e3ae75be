"""Leadership of the housekeeping (architecture decision 12): every worker process (and ``serve``)
keeps trying to hold the ``housekeeping`` lease; the reaper, reconciler, outbox polling, webhook
fan-out and purge of a process run only while it holds it. Eager dispatch, the job pools, the
heartbeat and the lock extension run everywhere.

The holder renews every third of the TTL. A follower tries again when the lease it saw expires
(by the database clock), so a leader killed with ``kill -9`` is replaced within the TTL. A
process counts itself leader only until its own monotonic clock says the TTL has passed since
the renewal it last sent, which is never later than the database's expiry: a leader cut off from
the store stops before anyone else may start.
"""

import logging
import threading
import time

from ..core.leases import Lease
from ..core.logs import log_event

HOUSEKEEPING = 'housekeeping'
RETRY_MARGIN_S = 0.02  # after the expiry we saw, so that the next attempt finds it expired


class Leadership:
    def __init__(self, store, instance_id, ttl_ms, name=HOUSEKEEPING):
        self.lease = Lease(store, name, instance_id, ttl_ms)
        self.connection = store.connection
        self.ttl_s = ttl_ms / 1000.0
        self._valid_until = 0.0  # monotonic; leader while now < this
        self._leader = False  # as last logged
        self._failing = False
        self._released = False  # a stopping process takes the lease no more
        self._lock = threading.Lock()

    def held(self):
        """Does this process hold the lease right now (by its own conservative reckoning)?"""
        return time.monotonic() < self._valid_until

    def step(self):
        """One attempt to take or renew the lease; returns the seconds to wait until the next."""
        if self._released:
            return self.ttl_s
        sent = time.monotonic()
        try:
            with self.connection():
                state = self.lease.take()
        except Exception as exc:  # a store outage: keep the role only while it surely holds
            if not self._failing:
                log_event('leader.renew_failed', logging.WARNING, error=exc.__class__.__name__)
            self._failing = True
            return self._after_failure()
        self._failing = False
        if state.held and self._released:  # renewed while the process stopped: give it back
            with self.connection():
                self.lease.release()
            return self.ttl_s
        with self._lock:
            if state.held:
                self._valid_until = sent + self.ttl_s
                if not self._leader:
                    self._leader = True
                    log_event('leader.acquired', lease=self.lease.name, ttl_ms=self.lease.ttl_ms)
                return self.ttl_s / 3
            self._valid_until = 0.0
            if self._leader:
                self._lost('taken_over', holder=state.holder)
        return min(self.ttl_s / 3, state.remaining_ms / 1000.0 + RETRY_MARGIN_S)

    def _after_failure(self):
        """The wait before trying again: a leader tries until its lease runs out (then says it
        lost the role); a follower at its usual pace."""
        with self._lock:
            if not self._leader:
                return self.ttl_s / 3
            left = self._valid_until - time.monotonic()
            if left <= 0:
                self._lost('store_unreachable')
                return self.ttl_s / 3
            return max(0.05, min(self.ttl_s / 3, left))

    def run(self, stop, first_wait=0.0):
        """The election thread's loop, until ``stop`` is set."""
        wait = first_wait
        while not stop.wait(wait):
            wait = self.step()

    def release(self):
        """A clean shutdown: give the lease up at once, so a follower need not wait it out."""
        with self._lock:
            self._released = True
            was_leader, self._valid_until = self._leader, 0.0
            if not was_leader:
                return
            self._lost('released', level=logging.INFO)
        try:
            with self.connection():
                self.lease.release()
        except Exception:  # the store is down: the lease simply expires
            log_event('leader.release_failed', logging.WARNING, exc_info=True)

    def _lost(self, reason, level=logging.WARNING, **fields):
        self._leader = False
        log_event('leader.lost', level, lease=self.lease.name, reason=reason, **fields)
