"""The terminal writes of a running job's holder: running → succeeded or failed (and cancelled,
through ``_finish``, for lifecycle_cancel.py), each one fenced UPDATE written in one transaction
with its outbox event (architecture decision 15), its history row and its user's admission
counter. A part of AiJobLifecycleRepository (core/lifecycle.py), which gives it ``store``,
``outbox``, ``_in_transaction`` and ``_refusal``.

In a group commit (core/groupcommit.py) the terminal writes of the group go out as one UPDATE
per FINISH_BATCH jobs at its end (sql.rows_together).
"""

import functools

from . import admission
from .history import NewEvent, insert_events
from .lifecycle_sql import FINISH_BATCH, REFUSE_SHORT_FINISH, finish_update
from .sql import write_row
from .states import FAILED, SUCCEEDED


class FinishWrites:
    """AiJobLifecycleRepository's fenced running → terminal writes."""

    def mark_succeeded(self, job_id, *, fence, output_hash=None):
        """running → succeeded, only for the lock holder and only if nobody asked to cancel."""
        self._finish(
            job_id,
            SUCCEEDED,
            fence,
            {'progress': 100, 'output_hash': output_hash},
            'cancel_requested_at IS NULL',
        )

    def mark_failed(self, job_id, error, *, fence):
        """running → failed with the error's code, public and internal messages."""
        values = {
            'error_code': error.code,
            'public_error_message': (error.public_message or '')[:512],
            'internal_error_message': str(error)[:8000],
        }
        detail = {
            'errorCode': error.code,
            'message': values['public_error_message'],
            'internalMessage': str(error)[:2000],
        }
        self._finish(job_id, FAILED, fence, values, detail=detail)

    def _finish(self, job_id, to_status, fence, values, extra_condition=None, detail=None):
        """The fenced running → terminal write with its outbox event and its history row
        (``detail`` plus who wrote it); nothing is read back. Raises the refusal when the CAS
        matched nothing. In a group commit the terminal writes of the group go out as one
        UPDATE at its end (sql.rows_together); one refused fails them all, and the group runs
        again with each job's UPDATE on its own, where the refusal is that job's."""
        fence_sql, fence_params = fence.sql(self.store)
        shape = (to_status, tuple(values), fence_sql, extra_condition)
        finish = (job_id, tuple(values.values()), fence_params)
        event = NewEvent(job_id, to_status, fence.attempt_no, {**(detail or {}), **fence.actor()})

        def write(tx):
            try:
                # With other rows (a group commit), the UPDATE goes after them: it locks the job
                # and its user's admission row (which that user's creates wait for) until the
                # COMMIT. Alone it goes first, so a refusal writes nothing.
                write_row(
                    shape, finish, lambda finishes: self._plan_finishes(shape, finishes), last=True
                )
            except _Refused:  # written at once (alone): the refusal is this job's
                raise self._refusal(job_id, to_status, fence=fence) from None
            self.outbox.create_terminal_event(tx, job_id, to_status)
            insert_events(self.store, [event])

        self._in_transaction(write)

    def _plan_finishes(self, shape, finishes):
        """The terminal UPDATEs of ``finishes`` (job id, values, fence parameters) of one
        ``shape``, FINISH_BATCH per statement, each with its jobs' admission counters (in the
        same statement for one job on MySQL, else one UPDATE after it), planned for sql.send;
        each raises unless it matched every job of its chunk (_Refused for a lone job), and on
        MariaDB is followed by REFUSE_SHORT_FINISH, so that the server stops there too and a
        COMMIT sent with these rows never runs after a refusal."""
        to_status, columns, fence_sql, extra_condition = shape
        guarded = self.store.guards_row_counts()
        planned = []
        for start in range(0, len(finishes), FINISH_BATCH):
            chunk = finishes[start : start + FINISH_BATCH]
            releasing = len(chunk) == 1 and self.store.dialect == 'mysql'
            update = finish_update(columns, fence_sql, extra_condition, len(chunk), releasing)
            params = [to_status]
            for i in range(len(columns)):
                for job_id, values, _ in chunk:
                    params += (job_id, values[i])
            for job_id, _, fence_params in chunk:
                params += (job_id,) + fence_params
            check = functools.partial(_check_finished, [job_id for job_id, _, _ in chunk])
            planned.append((update, params, check))
            if guarded:
                planned.append((REFUSE_SHORT_FINISH, (len(chunk),), None))
            if not releasing:
                # Sent even when the UPDATE fell short: that fails, and rolls back, the group.
                planned += admission.plan_release(self.store, [job_id for job_id, _, _ in chunk])
        return planned


class _Refused(Exception):
    """A lone job's terminal UPDATE matched nothing (why is read once the results are in)."""


def _check_finished(job_ids, cursor):
    """sql.send's receive of a terminal UPDATE: every job of ``job_ids`` matched. On MySQL a
    lone job's UPDATE also changes its admission counters' row, which counts too."""
    matched = cursor.rowcount
    if len(job_ids) == 1:
        if matched < 1:
            raise _Refused(job_ids[0])
        return
    if matched != len(job_ids):
        # Whose it was shows when the group commit writes each job's UPDATE on its own.
        raise RuntimeError(
            '%d of %d terminal writes refused' % (len(job_ids) - matched, len(job_ids))
        )
