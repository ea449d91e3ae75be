"""The transition history (architecture decision 14): one ai_job_event row per lifecycle change,
written in the transaction of the change, read back in order; the owner's and the admin's
views."""

import datetime

from engine.core.history import JobEvent, JobHistory
from engine.core.models import AiJobEvent
from tests.support.helpers import create_job, new_request


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
