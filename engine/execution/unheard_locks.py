"""Locks a worker may hold without knowing it.

A batch lock's UPDATE and its COMMIT go out in one round trip (docs/architecture.md, decision
10). When the connection drops after the server ran them but before the worker read the answer,
the jobs are ``running`` and locked by this worker, and no thread of it runs them: the worker
saw an error and put the messages back. When a message comes back, the lock's UPDATE changes
nothing (the row is already this worker's, its lock not expired), so without help the job waits
for its lock to expire and the reaper to take it over as a second attempt.

This book remembers which ids a lost lock may have taken, and hands them to the next lock of
the same ids to adopt: that lock also returns them if the store says this worker holds them.
An id is adopted only when no thread of this worker holds it or is locking it, so a duplicate
message never makes two threads run one job. The engine calls every method under its own lock
on held attempts (``ExecutionEngine._held_lock``, engine.py).
"""

from collections import Counter


class UnheardLocks:
    def __init__(self):
        self._locking = Counter()  # id -> locks of this worker taking it right now
        self._unheard = set()  # ids a lock of this worker may have taken without hearing it

    def begin(self, ids, held):
        """A lock of ``ids`` starts. Returns the ids it should adopt: unheard before, and
        neither ``held`` (a job id -> attempt mapping) nor being locked by another thread."""
        adopt = {i for i in ids if i in self._unheard and i not in held and not self._locking[i]}
        self._unheard -= adopt
        self._locking.update(ids)
        return adopt

    def lost(self, ids, held):
        """The lock of ``ids`` failed without an answer: any of them may now be this worker's.
        An id another thread holds is left out: that thread's lock was current, so this one
        could not have taken it. An id another thread is locking right now is not: both locks
        may fail (a duplicate message, both sent as the store went away)."""
        self._unheard.update(i for i in ids if i not in held)

    def end(self, ids):
        """The lock of ``ids`` is over: its jobs are held (or were not taken)."""
        self._locking.subtract(ids)
        for i in ids:
            if self._locking[i] <= 0:
                del self._locking[i]

    def unheard(self):
        """The ids still to adopt (a copy: for tests and diagnostics)."""
        return set(self._unheard)
