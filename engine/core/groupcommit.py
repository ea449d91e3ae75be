"""Group commit: the final transactions of jobs finished by several threads, coalesced into one.

Each commit waits for the disk (the database flushes its log), so a worker whose threads each
commit every job spends most of its time waiting for flushes one after another. Here the first
thread to arrive commits, in one transaction, the work of every thread that arrived while the
previous group was committing (or, with ``groups`` > 1, while that many were); the others wait
for that commit and return with it. A job's
writes are still committed before its caller goes on (and before anyone can see them): only the
number of commits changes, not what each one holds.

A work that raises is taken out of its group: the transaction rolls back, the exception becomes
that work's outcome (as if it had run alone in a transaction that failed), and the rest of the
group runs again without it. A deadlock retries the whole group; a store that cannot be reached
fails every work left (each caller then waits out the outage on its own).

``after_commit(outputs)``, when given, runs once per committed group on the thread that led it,
with what each committed work returned, before any of the group's callers goes on: what must
follow every commit (the creates' pushes to the queue) goes out once per group, not per work.
It runs after the group has given up the lead, so the next group's transaction is under way
meanwhile (never more than ``groups`` transactions at once).

``prepare(works)``, when given, runs inside the transaction before the works, with every work
about to run in it: a read they all need (the creates' admission counts) is one statement per
group, not per work. It runs again each time the group runs again.
"""

import contextlib
import functools
import logging
import threading

from .logs import log_event
from .sql import rows_together


class _Rollback(Exception):
    """One work failed: roll the group's transaction back."""


class _RowsFailed(Exception):
    """The rows the works wrote together failed, and no one work can be named for it."""


class _Ticket:
    __slots__ = ('works', 'outcomes', 'taken', 'done')

    def __init__(self, works):
        self.works = works
        self.outcomes = [None] * len(works)  # per work: None (committed) or the error it raised
        self.taken = False  # a leader took it into its group
        self.done = False  # its group ended


class GroupCommit:
    def __init__(
        self,
        store,
        after_commit=None,
        prepare=None,
        groups=1,
        commit_with_rows=None,
        connection=None,
    ):
        """``groups``: how many groups may commit at once (each its own transaction).
        ``connection()``, when given, is the unit of database work the leader commits in: the
        callers hold no connection while they wait (a worker finishing thousands of jobs at
        once would otherwise hold the pool's every connection with waiting callers).
        ``commit_with_rows()``, when given and true, sends the COMMIT with the rows the works
        wrote together (sql.rows_together's ``ends_transaction``): for works whose every refusal
        is an error of a statement, never an answer read back."""
        self.store = store
        self.commit_with_rows = commit_with_rows or (lambda: False)
        self.connection = connection or contextlib.nullcontext
        self.after_commit = after_commit
        self.prepare = prepare or (lambda works: None)
        self._cond = threading.Condition()
        self._waiting = []  # tickets for the next group
        self.max_groups = groups
        self._leaders = 0  # groups committing now
        self.groups = 0  # committed groups and the works they held, for the benchmark
        self.works = 0

    def run(self, works):
        """Run every ``work(tx)`` of ``works`` inside one transaction, shared with the works other
        threads submit meanwhile. Returns one outcome per work once its transaction ended:
        None when it committed, else the exception it raised (nothing of it was written). Call
        it inside a unit of database work (the leader commits on its thread's connection),
        unless the GroupCommit was given its ``connection``."""
        if self.store.in_transaction():  # the caller's transaction: no one else's work joins it
            outputs = []
            outcomes = [self._alone(work, outputs) for work in works]
            self._after(outputs)
            return outcomes
        ticket = _Ticket(list(works))
        with self._cond:
            self._waiting.append(ticket)
            while not ticket.done and (self._leaders >= self.max_groups or ticket.taken):
                self._cond.wait()
            if ticket.done:  # another thread led the group that held it
                return ticket.outcomes
            self._leaders += 1
            group, self._waiting = self._waiting, []
            for member in group:
                member.taken = True
        try:
            with self.connection():
                outputs = self._commit(group)
        except BaseException as exc:  # the leader's own failure ends every work of its group
            for member in group:
                member.outcomes = [exc] * len(member.works)
            self._give_up_the_lead()
            self._end(group)
            raise
        self._give_up_the_lead()  # the next group may begin while this one's after_commit runs
        try:
            self._after(outputs)
        finally:
            self._end(group)
        return ticket.outcomes

    def _give_up_the_lead(self):
        """This group's transaction ended: another may begin (once per group, or more than
        ``groups`` would commit at once)."""
        with self._cond:
            self._leaders -= 1
            self._cond.notify_all()

    def _end(self, group):
        """The group's callers go on."""
        with self._cond:
            for member in group:
                member.done = True
            self._cond.notify_all()

    def _alone(self, work, outputs):
        try:
            with self.store.atomic() as tx:
                self.prepare([work])
                output = work(tx)
        except Exception as exc:
            return exc
        outputs.append(output)
        return None

    def _after(self, outputs):
        """after_commit, whose failure is logged: the works have committed whatever it does."""
        if self.after_commit is None or not outputs:
            return
        try:
            self.after_commit(outputs)
        except Exception:
            log_event('group_commit.after_commit_failed', logging.WARNING, exc_info=True)

    def _commit(self, group):
        """The group's works in one transaction, a failing work taken out and the rest run again.
        Returns what the committed works returned."""
        left = [(member, i) for member in group for i in range(len(member.works))]
        together = True
        while left:
            try:
                outputs = self.store.run_in_transaction(
                    functools.partial(self._all, left, together)
                )
            except _RowsFailed:
                together = False  # again, each work's rows written at once: the culprit shows
                continue
            except _Rollback as rollback:
                member, i, exc = rollback.args
            except Exception as exc:  # the store: every work left fails with it
                for member, i in left:
                    member.outcomes[i] = exc
                return []
            else:
                self.groups += 1
                self.works += len(left)
                return outputs
            member.outcomes[i] = exc
            left.remove((member, i))
            log_event(
                'group_commit.work_failed',
                logging.INFO,
                works=len(left) + 1,
                error_type=exc.__class__.__name__,
            )
        return []  # every work failed

    def _all(self, left, together, tx):
        """Every work of ``left`` in the transaction ``tx``, their rows written ``together``
        (sql.rows_together: one INSERT per statement for the whole group); the first work that
        raises rolls it back (_Rollback names it). Returns what the works returned. A failing
        ``prepare`` fails every work (the store's trouble, or a bug: no one work to blame)."""
        self.prepare([member.works[i] for member, i in left])
        outputs = []
        try:
            ends = together and self.commit_with_rows()
            with rows_together(ends_transaction=ends) if together else contextlib.nullcontext():
                for member, i in left:
                    try:
                        outputs.append(member.works[i](tx))
                    except Exception as exc:
                        if self.store.is_transient(exc) or self.store.is_unreachable(exc):
                            raise  # the transaction's trouble, not this work's
                        raise _Rollback(member, i, exc) from exc
        except _Rollback:
            raise
        except Exception as exc:
            if self.store.is_transient(exc) or self.store.is_unreachable(exc):
                raise
            raise _RowsFailed() from exc
        return outputs
