"""The transition history (architecture decision 14): one ai_job_event row per lifecycle change,
written in the transaction of the change, read back in order; the owner's and the admin's
views."""

import datetime
import time

import pytest

from engine.core.errors import InternalJobError, JobLockConflictError
from engine.core.fences import ExpiredLockFence, Fence
from engine.core.history import JobEvent, JobHistory
from engine.core.models import AiJob, AiJobEvent
from tests.support.helpers import create_job, new_request, wait_until
from tests.support.runtimes import run_job, wait_terminal


def kinds(rt, job_id):
    return [event.kind for event in JobHistory(rt.store).list(job_id)]


def test_a_created_job_has_its_created_event_and_dispatched_when_pushed_at_once(runtime):
    job = create_job(runtime)
    events = JobHistory(runtime.store).list(job.id)
    # With Redis the creating process claims the outbox event and pushes it right after commit;
    # with the in-memory queue the dispatcher's polling does.
    expected = ['created', 'dispatched'] if runtime.config.uses_redis else ['created']
    assert [e.kind for e in events] == expected
    created = events[0]
    assert (created.job_id, created.attempt_no) == (job.id, 0)
    assert created.detail == {'queue': 'ai-interactive', 'priority': 50}
    assert isinstance(created.id, int) and isinstance(created.at, datetime.datetime)
    assert abs((created.at - job.created_at).total_seconds()) < 1


def test_a_refused_create_writes_no_event(runtime):
    runtime.service.create_job(new_request(key='k'))
    before = AiJobEvent.select().count()
    runtime.service.create_job(new_request(key='k'))  # an idempotent replay: no new job
    assert AiJobEvent.select().count() == before


def test_list_pages_after_an_id_and_up_to_a_limit(runtime):
    job = create_job(runtime)
    other = create_job(runtime)
    history = JobHistory(runtime.store)
    everything = history.list(job.id)
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    assert all(e.job_id == job.id for e in everything)
    assert history.list(job.id, after_id=everything[0].id) == everything[1:]
    assert history.list(job.id, limit=1) == everything[:1]
    assert history.list(other.id)[0].id > everything[0].id


def test_the_public_view_hides_workers_dispatchers_and_internal_messages():
    event = JobEvent(
        7,
        'job-1',
        'failed',
        2,
        {'errorCode': 'X', 'message': 'public', 'internalMessage': 'secret', 'worker': 'w-1'},
        datetime.datetime(2026, 1, 2, 3, 4, 5, 678901),
    )
    assert event.public() == {
        'id': 7,
        'jobId': 'job-1',
        'kind': 'failed',
        'attemptNo': 2,
        'detail': {'errorCode': 'X', 'message': 'public'},
        'at': '2026-01-02T03:04:05.678Z',
    }
    assert event.admin()['detail'] == event.detail


def test_initdb_adds_the_history_table_to_an_older_database(runtime):
    runtime.store.db.drop_tables([AiJobEvent])
    assert 'ai_job_event' not in runtime.store.db.get_tables()
    runtime.create_schema()
    assert 'ai_job_event' in runtime.store.db.get_tables()
    job = create_job(runtime)
    assert kinds(runtime, job.id)[0] == 'created'


# ------------------------------------------------------------ every transition leaves its row


def history(rt, job_id):
    """(kind, attempt, detail) of each event, in order, the time left out."""
    return [(e.kind, e.attempt_no, e.detail) for e in JobHistory(rt.store).list(job_id)]


def created_and_dispatched(rt, job_id):
    """The first two rows: created, then dispatched (eagerly with Redis, by the poll in memory);
    returns the rest."""
    events = history(rt, job_id)
    assert events[0][:2] == ('created', 0)
    assert events[1][0] == 'dispatched' and events[1][2]['queue'] == 'ai-interactive'
    return events[2:]


def test_a_job_that_retried_twice_then_succeeded(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, failWith='PROVIDER_RATE_LIMITED', failTimes=2)
    assert job.lifecycle_status == 'succeeded'
    worker = job.locked_by
    rest = created_and_dispatched(engine_rt, job.id)
    retries = [event for event in rest if event[0] == 'retry_scheduled']
    assert [kind for kind, _, _ in rest] == [
        'started',
        'retry_scheduled',
        'retry_scheduled',
        'succeeded',
    ]
    assert rest[0] == ('started', 1, {'worker': worker})
    for number, (_, attempt_no, detail) in enumerate(retries, start=1):
        assert attempt_no == 1
        assert detail['retryNo'] == number and detail['errorCode'] == 'PROVIDER_RATE_LIMITED'
        assert detail['backoffMs'] >= 20 and detail['worker'] == worker
        assert 'synthetic failure' in detail['internalMessage']
    assert rest[-1] == ('succeeded', 1, {'worker': worker})
    # The owner's view: the same rows, without worker ids and internal messages.
    public = [e.public() for e in JobHistory(engine_rt.store).list(job.id)]
    assert [e['kind'] for e in public][2:] == [kind for kind, _, _ in rest]
    for event in public:
        assert not {'worker', 'dispatcher', 'internalMessage'} & set(event['detail'])
    assert public[3]['detail'] == {'retryNo': 1, 'errorCode': 'PROVIDER_RATE_LIMITED'} | {
        'backoffMs': retries[0][2]['backoffMs']
    }


@pytest.mark.slow
def test_a_job_cancelled_while_running(engine_rt):
    engine_rt.start_background()
    job = create_job(engine_rt, input={'sleepMs': 3000, 'progressSteps': 10})
    wait_until(lambda: AiJob.get_by_id(job.id).progress >= 20, timeout=10)
    engine_rt.service.cancel_job(job.id)
    done = wait_terminal(engine_rt, job.id)
    assert done.lifecycle_status == 'cancelled'
    rest = created_and_dispatched(engine_rt, job.id)
    kinds_ = [kind for kind, _, _ in rest]
    assert kinds_[0] == 'started' and kinds_[-2:] == ['cancel_requested', 'cancelled']
    progress = [detail['progress'] for kind, _, detail in rest if kind == 'progress']
    assert kinds_[1:-2] == ['progress'] * len(progress)
    assert progress[:2] == [10, 20] and progress == sorted(set(progress))
    assert rest[-2] == ('cancel_requested', 1, {})
    assert rest[-1] == ('cancelled', 1, {'errorCode': 'CANCELLED', 'worker': done.locked_by})


def test_progress_milestones_are_at_most_one_per_ten_points(engine_rt):
    engine_rt.start_background()
    job = run_job(engine_rt, progressSteps=20)  # reports 5, 10, 15, … 100
    rest = created_and_dispatched(engine_rt, job.id)
    progress = [detail['progress'] for kind, _, detail in rest if kind == 'progress']
    # A provider reports at most 99: 100 is the success itself.
    assert progress == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert [kind for kind, _, _ in rest] == ['started'] + ['progress'] * 9 + ['succeeded']


def test_a_queued_job_cancelled_has_one_cancelled_row(runtime):
    job = create_job(runtime)
    runtime.service.cancel_job(job.id)
    assert history(runtime, job.id)[-1] == ('cancelled', 0, {'errorCode': 'CANCELLED'})
    assert kinds(runtime, job.id).count('cancelled') == 1


def test_a_takeover_and_a_reaped_failure_are_in_the_history(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1', lock_ttl_ms=1)
    time.sleep(0.02)
    repo.lock_job(job.id, 'worker-2', lock_ttl_ms=1)
    time.sleep(0.02)
    assert runtime.lifecycle.record_worker_lost(repo.get(job.id))
    assert not runtime.lifecycle.record_worker_lost(repo.get(job.id))  # once per attempt
    repo.mark_failed(
        job.id,
        InternalJobError('worker worker-2 lost', code='INTERNAL_WORKER_LOST', public_message='P'),
        fence=ExpiredLockFence(2, 0),
    )
    events = history(runtime, job.id)
    assert [e for e in events if e[0] != 'dispatched'][1:] == [
        ('started', 1, {'worker': 'worker-1'}),
        ('taken_over', 2, {'worker': 'worker-2'}),
        ('worker_lost', 2, {'worker': 'worker-2', 'by': 'reaper'}),
        (
            'failed',
            2,
            {
                'errorCode': 'INTERNAL_WORKER_LOST',
                'message': 'P',
                'internalMessage': 'worker worker-2 lost',
                'by': 'reaper',
            },
        ),
    ]


def test_a_refused_transition_writes_no_row(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1')
    before = kinds(runtime, job.id)
    with pytest.raises(JobLockConflictError):
        repo.lock_job(job.id, 'worker-2')  # still held
    with pytest.raises(JobLockConflictError):
        repo.set_progress(job.id, Fence('worker-2', 1), 50, milestone=True)
    with pytest.raises(JobLockConflictError):
        repo.mark_succeeded(job.id, fence=Fence('worker-2', 1))
    assert kinds(runtime, job.id) == before


def test_an_admin_retry_links_both_histories(runtime):
    job = create_job(runtime)
    runtime.service.cancel_job(job.id)
    new = runtime.service.retry_job(job.id)
    assert history(runtime, job.id)[-1] == ('retried', 0, {'retryJobId': new.id})
    created = history(runtime, new.id)[0]
    assert created == (
        'created',
        0,
        {'queue': 'ai-interactive', 'priority': 50, 'retryOfJobId': job.id},
    )
