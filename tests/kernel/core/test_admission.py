"""The per-user limits' counters (engine/core/admission.py, ai_user_admission): exact under racing
creates of one user, whatever the group commits and processes, and kept by the very transactions
that change a job's status, so they always equal what a count of the user's jobs would say."""

import time

import pytest

from engine.core.admission import backfill
from engine.core.errors import JobLockConflictError, ProviderError
from engine.core.fences import ExpiredLockFence, Fence
from engine.core.groupcommit import GroupCommit
from engine.core.models import AiJob, AiUserAdmission
from tests.support.helpers import create_job, new_request, run_threads

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def counters(user_id='user-a'):
    """(active, created today) as the counters say."""
    row = AiUserAdmission.get_or_none(AiUserAdmission.user_id == user_id)
    return (row.active, row.created_on_day) if row is not None else (0, 0)


def counted(user_id='user-a'):
    """(active, created) as counting the user's jobs says (every job of a test is of today)."""
    jobs = AiJob.select().where(AiJob.user_id == user_id)
    active = jobs.where(AiJob.lifecycle_status.in_(['queued', 'running'])).count()
    return active, jobs.count()


def test_racing_creates_of_one_user_stop_exactly_at_the_limit_across_groups_and_services(
    make_runtime,
):
    """Forty requests at once for a user with room for five, half through one service and half
    through another (two processes' worth of group commits, four groups each at once): five
    jobs, the rest refused and writing nothing. The other user of the same groups is counted
    apart."""
    first = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='5')
    second = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='5')

    def create(i):
        service = (first if i % 2 else second).service
        user = 'user-a' if i % 4 < 3 else 'user-b'
        return service.create_job(new_request(user_id=user, input={'i': i}))

    with first.store.connection():
        results, errors = run_threads(40, create, first.store)
        assert {e.code for e in errors if e is not None} == {'TOO_MANY_JOBS'}
        users = [r.job.user_id for r in results if r is not None]
        assert (users.count('user-a'), users.count('user-b')) == (5, 5)
        assert AiJob.select().count() == 10
        assert counters('user-a') == counted('user-a') == (5, 5)
        assert counters('user-b') == counted('user-b') == (5, 5)


def test_racing_creates_stop_exactly_at_the_daily_quota(make_runtime):
    runtime = make_runtime(AIJOB_DAILY_JOB_QUOTA='3')
    with runtime.store.connection():
        results, errors = run_threads(
            12, lambda i: runtime.service.create_job(new_request(input={'i': i})), runtime.store
        )
        assert sorted(e.code for e in errors if e is not None) == ['QUOTA_EXCEEDED'] * 9
        assert counters() == counted() == (3, 3)


def test_every_terminal_write_frees_its_slot_in_its_own_transaction(runtime):
    """The engine's success and failure, the reaper's, the owner's cancel of a queued job and of
    a deferred one: each takes its job off the user's unfinished count; the daily count stays."""
    repo = runtime.lifecycle
    jobs = [create_job(runtime, input={'i': i}) for i in range(6)]
    assert counters() == counted() == (6, 6)

    def locked(job, ttl_ms=60_000):
        return repo.lock_job(job.id, 'worker-1', lock_ttl_ms=ttl_ms)

    job = locked(jobs[0])
    assert counters() == (6, 6)  # running is still unfinished
    repo.mark_succeeded(job.id, fence=Fence('worker-1', job.attempt_no), output_hash='h')
    job = locked(jobs[1])
    repo.mark_failed(job.id, ProviderError('boom'), fence=Fence('worker-1', job.attempt_no))
    job = locked(jobs[2], ttl_ms=1)
    time.sleep(0.02)  # expired: the reaper's fence holds
    repo.mark_failed(job.id, ProviderError('lost'), fence=ExpiredLockFence(job.attempt_no, 0))
    repo.mark_cancelled(jobs[3].id)  # queued: cancelled at once
    job = locked(jobs[4])
    repo.defer(job.id, Fence('worker-1', job.attempt_no), 60_000, 'rate_limited')
    repo.mark_cancelled(jobs[4].id)  # deferred: cancelled at once
    assert counters() == counted() == (1, 6)


def test_a_refused_terminal_write_leaves_the_counters(runtime):
    repo = runtime.lifecycle
    job = repo.lock_job(create_job(runtime).id, 'worker-1')
    with pytest.raises(JobLockConflictError):
        repo.mark_succeeded(job.id, fence=Fence('worker-2', job.attempt_no))  # not the holder
    assert counters() == counted() == (1, 1)


def test_a_create_that_fails_after_counting_leaves_the_counters(runtime, monkeypatch):
    create_job(runtime)

    def explode(*args, **kwargs):
        raise RuntimeError('injected after the admission counted the create')

    monkeypatch.setattr(runtime.outbox, 'create_in_transaction', explode)
    with pytest.raises(RuntimeError):
        create_job(runtime)
    assert counters() == counted() == (1, 1)


def test_a_finished_slot_is_free_again_and_the_quota_counts_from_a_new_day(make_runtime):
    runtime = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='1', AIJOB_DAILY_JOB_QUOTA='2')
    with runtime.store.connection():
        first = create_job(runtime)
        with pytest.raises(Exception) as raised:
            create_job(runtime)
        assert raised.value.code == 'TOO_MANY_JOBS'
        runtime.lifecycle.mark_cancelled(first.id)
        second = create_job(runtime)
        runtime.lifecycle.mark_cancelled(second.id)
        with pytest.raises(Exception) as raised:
            create_job(runtime)
        assert raised.value.code == 'QUOTA_EXCEEDED'
        # The counters' day is over (as at midnight UTC): the next create is the day's first.
        AiUserAdmission.update(day='2000-01-01').execute()
        create_job(runtime)
        assert counters() == (1, 1)


def test_without_limits_the_counters_are_kept_all_the_same(make_runtime):
    """Limits turned on later find the counters right."""
    runtime = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='0', AIJOB_DAILY_JOB_QUOTA='0')
    with runtime.store.connection():
        jobs = [create_job(runtime) for _ in range(3)]
        runtime.lifecycle.mark_cancelled(jobs[0].id)
        assert counters() == counted() == (2, 3)


def test_an_upgraded_deployment_counts_the_jobs_it_already_has(runtime):
    """initdb on a store whose jobs predate the counters fills them from the jobs, once."""
    jobs = [create_job(runtime, user_id=user) for user in ('user-a', 'user-a', 'user-b')]
    runtime.lifecycle.mark_cancelled(jobs[0].id)
    AiUserAdmission.delete().execute()  # as before the upgrade
    with runtime.store.atomic():
        backfill(runtime.store)
    assert counters('user-a') == counted('user-a') == (1, 2)
    assert counters('user-b') == counted('user-b') == (1, 1)
    with runtime.store.atomic():
        backfill(runtime.store)  # the table has rows: nothing again
    assert counters('user-a') == (1, 2)


def test_a_group_commit_of_terminal_writes_frees_each_of_its_jobs_once(runtime):
    """Several jobs of one user finished in one group commit (one terminal UPDATE for all);
    then a group where one is refused (not its holder): the others free their slots, the
    refused one not."""
    repo = runtime.lifecycle
    jobs = [repo.lock_job(create_job(runtime, input={'i': i}).id, 'worker-1') for i in range(6)]

    def finish(job, holder='worker-1'):
        return lambda tx: repo.mark_succeeded(job.id, fence=Fence(holder, job.attempt_no))

    group = GroupCommit(runtime.store)
    assert group.run([finish(job) for job in jobs[:3]]) == [None] * 3
    assert counters() == counted() == (3, 6)
    outcomes = group.run([finish(jobs[3]), finish(jobs[4], 'worker-2'), finish(jobs[5])])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], JobLockConflictError)
    assert counters() == counted() == (1, 6)


@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_limits_hold_with_the_constraint_and_without_it_until_initdb_adds_it(make_runtime, backend):
    """On MariaDB a refused create is the CHECK constraint's error (its writes then carry the
    COMMIT). A table from before the constraint is held by the limits all the same (the count
    read back), and ``initdb`` adds the constraint to it."""
    runtime = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='2')
    store = runtime.store
    with store.connection():
        schema_sql_clause = check_clause(store)  # as schema.sql made it
        store.db.execute_sql(
            'ALTER TABLE ai_user_admission DROP CONSTRAINT admission_within_limits'
        )
        store._checks.clear()  # as a process started before initdb
        assert not store.enforces_check('ai_user_admission', 'admission_within_limits')
        create_job(runtime, input={'i': 1})
        create_job(runtime, input={'i': 2})
        with pytest.raises(Exception) as raised:
            create_job(runtime, input={'i': 3})
        assert raised.value.code == 'TOO_MANY_JOBS'
        assert counters() == counted() == (2, 2)

        store.create_schema()  # initdb
        assert check_clause(store) == schema_sql_clause  # the upgrade adds the same condition
        store._checks.clear()
        assert store.enforces_check('ai_user_admission', 'admission_within_limits')
        with pytest.raises(Exception) as raised:
            create_job(runtime, input={'i': 4})
        assert raised.value.code == 'TOO_MANY_JOBS'
        assert counters() == counted() == (2, 2)
        runtime.lifecycle.mark_cancelled(AiJob.select().first().id)
        create_job(runtime, input={'i': 5})
        assert counters() == counted() == (2, 3)


def check_clause(store):
    """The condition of admission_within_limits as the database holds it."""
    return store.db.execute_sql(
        'SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS '
        "WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_NAME = 'admission_within_limits'"
    ).fetchone()[0]
