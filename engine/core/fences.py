"""Who may write a running job (architecture decision 3): every write after the lock is fenced,
its UPDATE's WHERE clause holding the fence's condition, so a worker that lost its lock (it
stalled and was taken over) writes nothing.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """The worker that holds a running job: its instance and the attempt it locked."""

    instance_id: str
    attempt_no: int

    def sql(self, store):
        """The condition as plain SQL: (text, parameters)."""
        return 'locked_by = %s AND attempt_no = %s', (self.instance_id, self.attempt_no)

    def actor(self):
        """Who writes under this fence, for the history (``worker`` is admin-only detail)."""
        return {'worker': self.instance_id}


@dataclass(frozen=True)
class ExpiredLockFence:
    """The reaper's fence: the attempt it saw, and only while that lock has been expired for
    ``expired_for_ms`` — a worker that heartbeats in the meantime wins."""

    attempt_no: int
    expired_for_ms: int

    def sql(self, store):
        return 'attempt_no = %s AND lock_until < {now_plus}', (
            self.attempt_no,
            store.ms_param(-self.expired_for_ms),
        )

    def actor(self):
        return {'by': 'reaper'}
