"""OutboxRepository (contracts §4): events written in the same transaction as the job, then claimed
by compare-and-set before they are pushed to a queue, so a push happens once per claim."""

from .models import OutboxEvent
from .store import IntegrityError

ENQUEUE_EVENT = 'ai.job.enqueue'
PENDING, PROCESSING, PUBLISHED, FAILED, DEAD = (
    'pending',
    'processing',
    'published',
    'failed',
    'dead',
)
MAX_ATTEMPTS = 3  # contracts §4.4: the third real failure makes an event dead


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
        the existing event is returned."""
        assert tx is not None and self.store.in_transaction(), 'outbox writes need a transaction'
        now = self.store.now()
        try:
            with self.store.atomic():  # a savepoint: a duplicate leaves the outer tx usable
                event_id = OutboxEvent.insert(
                    event_type=event_type,
                    aggregate_type=aggregate_type,
                    aggregate_id=aggregate_id,
                    dedupe_key=dedupe_key,
                    payload=payload,
                    status=PROCESSING if claimed_by else PENDING,
                    attempt_count=0,
                    available_at=now,
                    locked_by=claimed_by,
                    locked_at=now if claimed_by else None,
                    created_at=now,
                    updated_at=now,
                ).execute()
        except IntegrityError:
            return OutboxEvent.get(OutboxEvent.dedupe_key == dedupe_key)
        return OutboxEvent.get_by_id(event_id)

    def find_dispatchable(self, limit=100):
        """Pending events that are due, oldest first."""
        return list(
            OutboxEvent.select()
            .where((OutboxEvent.status == PENDING) & (OutboxEvent.available_at <= self.store.now()))
            .order_by(OutboxEvent.id)
            .limit(limit)
        )

    def mark_processing(self, event_id, instance_id):
        """CAS pending → processing. False when another dispatcher claimed it first."""
        now = self.store.now()
        return (
            OutboxEvent.update(
                {
                    OutboxEvent.status: PROCESSING,
                    OutboxEvent.locked_by: instance_id,
                    OutboxEvent.locked_at: now,
                    OutboxEvent.updated_at: now,
                }
            )
            .where((OutboxEvent.id == event_id) & (OutboxEvent.status == PENDING))
            .execute()
            == 1
        )

    def mark_published(self, event_id, instance_id):
        """processing → published, by the claimer only. False if the claim was lost."""
        return self._update_claimed(
            event_id,
            instance_id,
            {
                OutboxEvent.status: PUBLISHED,
                OutboxEvent.locked_by: None,
                OutboxEvent.locked_at: None,
            },
        )

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

    def release(self, event_id, instance_id, delay_ms):
        """Hand a claimed event back without counting an attempt (the queue was unreachable:
        an outage is not the event's fault)."""
        return self._update_claimed(
            event_id,
            instance_id,
            {
                OutboxEvent.status: PENDING,
                OutboxEvent.locked_by: None,
                OutboxEvent.locked_at: None,
                OutboxEvent.available_at: self.store.now_plus_ms(delay_ms),
            },
        )

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
