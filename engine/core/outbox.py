"""OutboxRepository (contracts §4): events written in the same transaction as the job, then claimed
by compare-and-set before they are pushed to a queue, so a push happens once per claim."""

from .fairness import user_key
from .history import DISPATCHED, NewEvent, insert_events
from .models import OutboxEvent
from .sql import Statement, insert_row, placeholders, statement
from .store import IntegrityError

ENQUEUE_EVENT = 'ai.job.enqueue'
# A deferred job's wake-up (lifecycle.defer): due at its wake time, pushed even where a message
# for the job still looks live (the deferring worker acks its own after the commit).
WAKE_EVENT = 'ai.job.wake'
# Written with the transition that makes a job terminal (contracts §4.1, decision 15).
TERMINAL_EVENTS = {
    'succeeded': 'ai.job.succeeded',
    'failed': 'ai.job.failed',
    'cancelled': 'ai.job.cancelled',
}
PENDING, PROCESSING, PUBLISHED, FAILED, DEAD = (
    'pending',
    'processing',
    'published',
    'failed',
    'dead',
)
MAX_ATTEMPTS = 3  # contracts §4.4: the third real failure makes an event dead

# The hot path's statements (sql.py).
_INSERT_HEAD = (
    'INSERT INTO outbox_event (event_type, aggregate_type, aggregate_id, dedupe_key, payload, '
    'status, attempt_count, available_at, locked_by, locked_at, created_at, updated_at) VALUES '
)
# One event's row, by whether it is inserted claimed (processing) by its creator.
_INSERT_ROWS = {
    False: "(%s, %s, %s, %s, %s, 'pending', 0, {now}, NULL, NULL, {now}, {now})",
    True: "(%s, %s, %s, %s, %s, 'processing', 0, {now}, %s, {now}, {now}, {now})",
}
_CLAIM_SET = (
    "UPDATE outbox_event SET status = 'processing', locked_by = %s, locked_at = {now}, "
    'updated_at = {now} WHERE '
)
_DUE = "status = 'pending' AND available_at <= {now} AND event_type %s (%s)"
# A wake-up: due at {now_plus}, inserted pending or claimed by the process that will push it.
_INSERT_WAKE = {
    False: _INSERT_HEAD
    + "(%s, %s, %s, %s, %s, 'pending', 0, {now_plus}, NULL, NULL, {now}, {now})",
    True: _INSERT_HEAD
    + "(%s, %s, %s, %s, %s, 'processing', 0, {now_plus}, %s, {now}, {now}, {now})",
}
SELECT_CLAIMED = Statement(
    'SELECT id, event_type, payload, attempt_count FROM outbox_event '
    "WHERE status = 'processing' AND locked_by = %s"
)


class ClaimStatements:
    """The claim of the events of some types (or, ``exclude``, of all other types): the terminal
    events go to the features' handlers (dispatch/terminal.py: the webhooks' fan-out, decision
    15), every other to the dispatcher (which marks an unknown type published, contracts §4.4);
    each loop claims only its own."""

    def __init__(self, event_types, exclude=False):
        names = ', '.join("'%s'" % name for name in event_types)
        due = _DUE % ('NOT IN' if exclude else 'IN', names)
        batch = due + ' ORDER BY id LIMIT %s'
        # MySQL updates with ORDER BY … LIMIT; SQLite (without that compile option) via the ids.
        self.claim = Statement(
            _CLAIM_SET + batch,
            _CLAIM_SET + 'id IN (SELECT id FROM outbox_event WHERE ' + batch + ')',
        )
        self.any_due = Statement('SELECT id FROM outbox_event WHERE ' + due + ' LIMIT 1')


TERMINAL_CLAIM = ClaimStatements(tuple(TERMINAL_EVENTS.values()))
ENQUEUE_CLAIM = ClaimStatements(tuple(TERMINAL_EVENTS.values()), exclude=True)


def _inserted_event(claimed_by, **fields):
    """The model of an event as it was just inserted: pending, or processing when the inserting
    process claimed it (``claimed_by``) to push it itself."""
    return OutboxEvent(
        __no_default__=True,
        status=PROCESSING if claimed_by else PENDING,
        attempt_count=0,
        locked_by=claimed_by,
        **fields,
    )


class OutboxRepository:
    def __init__(self, store, lock_ttl_ms=60_000):
        self.store = store
        self.lock_ttl_ms = lock_ttl_ms

    def create_in_transaction(
        self, tx, *, event_type, aggregate_type, aggregate_id, dedupe_key, payload, claimed_by=None
    ):
        """Insert an event inside the caller's transaction. ``claimed_by`` inserts it already
        claimed (processing) by that instance, for immediate dispatch after commit
        (architecture decision 6); if that process dies first, the claim expires like
        any other. A duplicate ``dedupe_key`` is an idempotent success (contracts §4.2):
        the existing event is returned. The row joins the other rows of a ``rows_together()``
        block and the event's id is filled in when it went out (returned by the INSERT, or on
        MySQL read back in the same round trip); a duplicate there fails the block's INSERT,
        and a group commit runs each work apart again, where this catches it."""
        assert tx is not None and self.store.in_transaction(), 'outbox writes need a transaction'
        event = _inserted_event(
            claimed_by,
            event_type=event_type,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            dedupe_key=dedupe_key,
            payload=payload,
        )
        params = (
            event_type,
            aggregate_type,
            aggregate_id,
            dedupe_key,
            OutboxEvent.payload.db_value(payload),
        )
        if claimed_by:
            params += (claimed_by,)

        def receive(returned):
            event.id = returned[1]

        row = _INSERT_ROWS[bool(claimed_by)]
        returning = ('dedupe_key, id', dedupe_key, receive)
        read_back = not self.store.insert_returns()
        try:
            # A duplicate key fails this statement only (MySQL and SQLite keep the transaction).
            insert_row(_INSERT_HEAD, row, params, returning=returning, read_back=read_back)
        except IntegrityError:
            return OutboxEvent.get(OutboxEvent.dedupe_key == dedupe_key)
        return event

    def create_terminal_event(self, tx, job_id, status):
        """The ``ai.job.<status>`` event of a job that just became terminal, in the transaction
        that made it so: a rolled-back attempt leaves none, and the dedupe key (one per job and
        event) makes a job that commits once have exactly one (a second insert is ignored)."""
        event_type = TERMINAL_EVENTS[status]
        payload = OutboxEvent.payload.db_value({'jobId': job_id, 'lifecycleStatus': status})
        dedupe_key = '%s:%s' % (event_type, job_id)
        params = (event_type, 'AiJob', job_id, dedupe_key, payload)
        # Written with the transition (sql.insert_row: with the others of a group commit).
        insert_row(_INSERT_HEAD, _INSERT_ROWS[False], params, ignore_duplicate=True)

    def create_wake_event(self, tx, job, delay_ms, claimed_by=None):
        """The durable wake-up of a job deferred by its attempt ``job.attempt_no``: an event due
        in ``delay_ms``, in the transaction of the deferral. ``claimed_by``: the deferring
        process pushes it itself at that time (dispatch.wake); if that process dies first, its
        claim expires and the dispatcher pushes it (contracts §4.5). Returns the event."""
        assert tx is not None and self.store.in_transaction(), 'outbox writes need a transaction'
        payload = {
            'jobId': job.id,
            'jobType': job.job_type,
            'queueName': job.queue_name,
            'priority': job.priority,
            'userKey': user_key(job.user_id),
        }
        dedupe_key = '%s:%s:%d' % (WAKE_EVENT, job.id, job.attempt_no)
        params = (WAKE_EVENT, 'AiJob', job.id, dedupe_key, OutboxEvent.payload.db_value(payload))
        params += (self.store.ms_param(delay_ms),)
        if claimed_by:
            params += (claimed_by,)
        cursor = self.store.execute(statement(_INSERT_WAKE[bool(claimed_by)]), params)
        return _inserted_event(
            claimed_by,
            id=cursor.lastrowid,
            event_type=WAKE_EVENT,
            dedupe_key=dedupe_key,
            payload=payload,
        )

    def claim_batch(self, claimer, limit=100, statements=ENQUEUE_CLAIM):
        """CAS up to ``limit`` due pending events → processing for ``claimer`` in one statement,
        then read exactly those (``claimer`` is unique to this claim). Events another dispatcher
        claimed first are simply not matched (contracts §4.3: a lost claim is skipped).
        ``statements`` chooses the event types (ENQUEUE_CLAIM or TERMINAL_CLAIM)."""
        if self.store.execute(statements.any_due).fetchone() is None:
            return []  # the usual idle poll: a read, not a write (and a commit) of nothing
        with self.store.atomic():
            if self.store.execute(statements.claim, (claimer, limit)).rowcount == 0:
                return []
            events = self._read_claimed(claimer)
            if statements is ENQUEUE_CLAIM:  # each queued job's history: claimed for a push
                insert_events(self.store, self._dispatch_events(events, claimer))
        return events

    def _dispatch_events(self, events, claimer):
        """The ``dispatched`` history rows of a claim's enqueue events whose job is still queued
        (an event claimed again after its job started pushes a message the lock refuses)."""
        rows = dispatch_events(events, claimer)
        if not rows:
            return rows
        ids = [row.job_id for row in rows]
        queued = {
            job_id
            for (job_id,) in self.store.execute(
                statement(
                    "SELECT id FROM ai_job WHERE id IN (%s) AND lifecycle_status = 'queued'"
                    % placeholders(len(ids))
                ),
                ids,
            ).fetchall()
        }
        return [row for row in rows if row.job_id in queued]

    def _read_claimed(self, claimer):
        rows = self.store.execute(SELECT_CLAIMED, (claimer,)).fetchall()
        payload = OutboxEvent.payload.python_value
        return [
            OutboxEvent(
                __no_default__=True,
                id=event_id,
                event_type=event_type,
                payload=payload(raw),
                attempt_count=attempts,
                status=PROCESSING,
                locked_by=claimer,
            )
            for event_id, event_type, raw, attempts in rows
        ]

    def mark_published_batch(self, event_ids, claimer):
        """processing → published for the events of ``claimer``'s claim, in one statement.
        Returns how many were still claimed by it."""
        return self._batch_update(
            event_ids,
            claimer,
            "status = 'published', locked_by = NULL, locked_at = NULL, updated_at = {now}",
        )

    def release_batch(self, event_ids, claimer, delay_ms):
        """Hand claimed events back without counting an attempt (the queue was unreachable)."""
        return self._batch_update(
            event_ids,
            claimer,
            "status = 'pending', locked_by = NULL, locked_at = NULL, updated_at = {now}, "
            'available_at = {now_plus}',
            (self.store.ms_param(delay_ms),),
        )

    def _batch_update(self, event_ids, claimer, assignments, params=()):
        if not event_ids:
            return 0
        update = statement(
            'UPDATE outbox_event SET %s WHERE id IN (%s) AND status = %%s AND locked_by = %%s'
            % (assignments, placeholders(len(event_ids)))
        )
        params = params + tuple(event_ids) + (PROCESSING, claimer)
        if self.store.in_transaction():  # the caller's transaction, retried as a whole
            return self.store.execute(update, params).rowcount
        # Alone, it is a deadlock's victim now and then (another dispatcher's claim scans the
        # same status index): tried again, as a transaction that lost a deadlock is.
        return self.store.execute_alone(update, params).rowcount

    def mark_failed(self, event_id, instance_id, error, retry_delay_ms=1000):
        """A real rejection: count it; back to pending after ``retry_delay_ms``, or ``dead`` at
        the third. Returns the new status, or None if the claim was lost."""
        event = OutboxEvent.get_or_none(OutboxEvent.id == event_id)
        if event is None or event.status != PROCESSING or event.locked_by != instance_id:
            return None
        attempts = event.attempt_count + 1
        status = DEAD if attempts >= MAX_ATTEMPTS else PENDING
        changed = self._update_claimed(
            event_id,
            instance_id,
            {
                OutboxEvent.status: status,
                OutboxEvent.attempt_count: attempts,
                OutboxEvent.last_error: str(error)[:512],
                OutboxEvent.locked_by: None,
                OutboxEvent.locked_at: None,
                OutboxEvent.available_at: self.store.now_plus_ms(retry_delay_ms),
            },
            OutboxEvent.attempt_count == event.attempt_count,
        )
        return status if changed else None

    def release_expired_locks(self, ttl_ms=None):
        """processing claims older than the TTL (by the database clock) → pending. Returns how
        many were released (contracts §4.5: a dispatcher died between claim and push)."""
        expired_before = self.store.now_plus_ms(-(ttl_ms or self.lock_ttl_ms))
        return (
            OutboxEvent.update(
                {
                    OutboxEvent.status: PENDING,
                    OutboxEvent.locked_by: None,
                    OutboxEvent.locked_at: None,
                    OutboxEvent.updated_at: self.store.now(),
                }
            )
            .where((OutboxEvent.status == PROCESSING) & (OutboxEvent.locked_at < expired_before))
            .execute()
        )

    def purge_finished(self, older_than_ms, limit=1000):
        """Delete up to ``limit`` published or dead events last touched ``older_than_ms`` ago;
        pending, failed and claimed ones stay. Returns how many were deleted."""
        cutoff = self.store.now_plus_ms(-older_than_ms)
        ids = [
            row.id
            for row in OutboxEvent.select(OutboxEvent.id)
            .where(
                OutboxEvent.status.in_((PUBLISHED, DEAD))
                & (OutboxEvent.available_at < cutoff)
                & (OutboxEvent.updated_at < cutoff)
            )
            .limit(limit)
        ]
        if not ids:
            return 0
        return OutboxEvent.delete().where(OutboxEvent.id.in_(ids)).execute()

    def _update_claimed(self, event_id, instance_id, values, extra=None):
        values = dict(values)
        values[OutboxEvent.updated_at] = self.store.now()
        where = (
            (OutboxEvent.id == event_id)
            & (OutboxEvent.status == PROCESSING)
            & (OutboxEvent.locked_by == instance_id)
        )
        if extra is not None:
            where &= extra
        return OutboxEvent.update(values).where(where).execute() == 1


def dispatch_events(events, claimer):
    """The ``dispatched`` history rows of the enqueue events of a claim (its pushes follow)."""
    rows = []
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.event_type == ENQUEUE_EVENT and payload.get('jobId'):
            detail = {'queue': payload.get('queueName'), 'dispatcher': claimer}
            rows.append(NewEvent(payload['jobId'], DISPATCHED, 0, detail))
    return rows
