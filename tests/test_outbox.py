"""OutboxRepository (contracts §4): CAS claims, attempt counting, expired claims."""

import time

from engine.core.models import OutboxEvent
from engine.core.outbox import DEAD, PENDING, PROCESSING
from tests.support.helpers import create_job, run_threads


def one_event(runtime):
    """A pending enqueue event (immediate dispatch off, as in a process without a queue)."""
    runtime.service.dispatch_now = None
    job = create_job(runtime)
    return OutboxEvent.get(OutboxEvent.aggregate_id == job.id)


def test_find_dispatchable_returns_due_pending_events(runtime):
    event = one_event(runtime)
    assert [e.id for e in runtime.outbox.find_dispatchable()] == [event.id]
    runtime.outbox.mark_processing(event.id, 'd1')
    assert runtime.outbox.find_dispatchable() == []


def test_two_claimers_race_and_one_wins(runtime):
    event = one_event(runtime)
    for _ in range(5):
        results, errors = run_threads(
            2,
            lambda i: runtime.outbox.mark_processing(event.id, 'dispatcher-%d' % i),
            runtime.store,
        )
        assert errors == [None, None] and sorted(results) == [False, True]
        winner = 'dispatcher-%d' % results.index(True)
        claimed = OutboxEvent.get_by_id(event.id)
        assert (claimed.status, claimed.locked_by) == (PROCESSING, winner)
        assert not runtime.outbox.mark_published(event.id, 'someone-else')
        runtime.outbox.release(event.id, winner, delay_ms=0)


def test_three_failures_make_an_event_dead(runtime):
    event = one_event(runtime)
    statuses = []
    for _ in range(3):
        assert runtime.outbox.mark_processing(event.id, 'd1')
        statuses.append(
            runtime.outbox.mark_failed(event.id, 'd1', 'DISPATCH_FAILED', retry_delay_ms=0)
        )
    assert statuses == [PENDING, PENDING, DEAD]
    dead = OutboxEvent.get_by_id(event.id)
    assert (dead.status, dead.attempt_count, dead.last_error) == (DEAD, 3, 'DISPATCH_FAILED')
    assert not runtime.outbox.mark_processing(event.id, 'd1')


def test_a_failure_reports_a_delay_before_the_next_try(runtime):
    event = one_event(runtime)
    runtime.outbox.mark_processing(event.id, 'd1')
    runtime.outbox.mark_failed(event.id, 'd1', 'DISPATCH_FAILED', retry_delay_ms=60_000)
    assert runtime.outbox.find_dispatchable() == []


def test_release_without_counting_an_attempt(runtime):
    event = one_event(runtime)
    runtime.outbox.mark_processing(event.id, 'd1')
    assert runtime.outbox.release(event.id, 'd1', delay_ms=0)
    released = OutboxEvent.get_by_id(event.id)
    assert (released.status, released.attempt_count) == (PENDING, 0)


def test_an_expired_processing_claim_goes_back_to_pending(runtime):
    event = one_event(runtime)
    runtime.outbox.mark_processing(event.id, 'crashed-dispatcher')
    assert runtime.outbox.release_expired_locks(ttl_ms=60_000) == 0
    time.sleep(0.05)
    assert runtime.outbox.release_expired_locks(ttl_ms=20) == 1
    released = OutboxEvent.get_by_id(event.id)
    assert (released.status, released.locked_by) == (PENDING, None)
    assert not runtime.outbox.mark_published(event.id, 'crashed-dispatcher')


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
