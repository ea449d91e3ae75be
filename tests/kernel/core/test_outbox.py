"""OutboxRepository (contracts §4): CAS claims, attempt counting, expired claims."""

import time

import pytest

from engine.core.models import OutboxEvent
from engine.core.outbox import DEAD, PENDING, PROCESSING
from tests.support.helpers import create_job, run_threads

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def one_event(runtime):
    """A pending enqueue event (immediate dispatch off, as in a process without a queue)."""
    runtime.service.dispatch_now = None
    job = create_job(runtime)
    return OutboxEvent.get(OutboxEvent.aggregate_id == job.id)


def claimed_ids(runtime, claimer):
    return [e.id for e in runtime.outbox.claim_batch(claimer)]


def test_a_claim_takes_due_pending_events_only(runtime):
    event = one_event(runtime)
    assert claimed_ids(runtime, 'd1') == [event.id]
    assert claimed_ids(runtime, 'd2') == []  # claimed already


def test_two_claimers_race_and_one_wins(runtime):
    event = one_event(runtime)
    for round_no in range(5):
        results, errors = run_threads(
            2,
            lambda i, r=round_no: claimed_ids(runtime, 'dispatcher-%d-%d' % (i, r)),
            runtime.store,
        )
        assert errors == [None, None] and sorted(results) == [[], [event.id]]
        winner = 'dispatcher-%d-%d' % ([bool(r) for r in results].index(True), round_no)
        claimed = OutboxEvent.get_by_id(event.id)
        assert (claimed.status, claimed.locked_by) == (PROCESSING, winner)
        assert runtime.outbox.mark_published_batch([event.id], 'someone-else') == 0
        assert runtime.outbox.release_batch([event.id], winner, delay_ms=0) == 1


def test_three_failures_make_an_event_dead(runtime):
    event = one_event(runtime)
    statuses = []
    for attempt in range(3):
        assert claimed_ids(runtime, 'd%d' % attempt) == [event.id]
        statuses.append(runtime.outbox.mark_failed(event.id, 'd%d' % attempt, 'DISPATCH_FAILED', 0))
    assert statuses == [PENDING, PENDING, DEAD]
    dead = OutboxEvent.get_by_id(event.id)
    assert (dead.status, dead.attempt_count, dead.last_error) == (DEAD, 3, 'DISPATCH_FAILED')
    assert claimed_ids(runtime, 'd9') == []


def test_a_failure_reports_a_delay_before_the_next_try(runtime):
    event = one_event(runtime)
    claimed_ids(runtime, 'd1')
    runtime.outbox.mark_failed(event.id, 'd1', 'DISPATCH_FAILED', retry_delay_ms=60_000)
    assert claimed_ids(runtime, 'd2') == []


def test_release_without_counting_an_attempt(runtime):
    event = one_event(runtime)
    claimed_ids(runtime, 'd1')
    assert runtime.outbox.release_batch([event.id], 'd1', delay_ms=0) == 1
    released = OutboxEvent.get_by_id(event.id)
    assert (released.status, released.attempt_count) == (PENDING, 0)


def test_an_expired_processing_claim_goes_back_to_pending(runtime):
    event = one_event(runtime)
    claimed_ids(runtime, 'crashed-dispatcher')
    assert runtime.outbox.release_expired_locks(ttl_ms=60_000) == 0
    time.sleep(0.05)
    assert runtime.outbox.release_expired_locks(ttl_ms=20) == 1
    released = OutboxEvent.get_by_id(event.id)
    assert (released.status, released.locked_by) == (PENDING, None)
    assert runtime.outbox.mark_published_batch([event.id], 'crashed-dispatcher') == 0


def test_a_duplicate_dedupe_key_returns_the_existing_event(runtime):
    event = one_event(runtime)
    with runtime.store.atomic() as tx:
        again = runtime.outbox.create_in_transaction(
            tx,
            event_type='ai.job.enqueue',
            aggregate_type='AiJob',
            aggregate_id='other',
            dedupe_key=event.dedupe_key,
            payload={},
        )
    assert again.id == event.id and OutboxEvent.select().count() == 1
