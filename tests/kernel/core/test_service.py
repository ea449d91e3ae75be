"""AiJobService.create_job (contracts §2.4): one transaction, idempotency, validation before
writes."""

import threading

import pytest

from engine.core.errors import (
    IdempotencyKeyReusedError,
    InvalidInputError,
    InvalidRequestError,
    UnknownJobTypeError,
)
from engine.core.fairness import user_key
from engine.core.groupcommit import GroupCommit
from engine.core.models import AiJob, AiJobSnapshot, AiUserAdmission, OutboxEvent
from engine.core.store import EXACT_COLUMNS
from tests.support.helpers import new_request, record_sent_statements, run_threads, wait_until

# Every SQL branch: SQLite, MariaDB's and MySQL's (tests/support/backends.py, ALL_DIALECTS).
pytestmark = pytest.mark.all_dialects


def counts():
    return AiJob.select().count(), AiJobSnapshot.select().count(), OutboxEvent.select().count()


def test_create_writes_job_snapshot_and_enqueue_event(runtime):
    result = runtime.service.create_job(new_request(key='k1', input={'sleepMs': 5}))
    job = result.job
    assert result.created and job.lifecycle_status == 'queued'
    assert (job.queue_name, job.priority, job.credential_mode) == (
        'ai-interactive',
        50,
        'platform_key',
    )
    assert job.created_at is not None and job.max_retry_count == 2
    assert runtime.service.snapshot(job.id) == {'input': {'sleepMs': 5}, 'overrides': {}}
    # With a shared queue (Redis) the creating process publishes its event at once (and marks it
    # published with its next batch of marks).
    runtime.dispatcher.marks.flush()
    event = OutboxEvent.get(OutboxEvent.aggregate_id == job.id)
    expected_status = 'published' if runtime.config.uses_redis else 'pending'
    assert (event.event_type, event.aggregate_type, event.status) == (
        'ai.job.enqueue',
        'AiJob',
        expected_status,
    )
    assert event.dedupe_key == 'synthetic:user-a:k1'
    assert event.payload == {
        'jobId': job.id,
        'jobType': 'synthetic',
        'queueName': 'ai-interactive',
        'priority': 50,
        'userKey': user_key('user-a'),  # the user's opaque queue key, never the id
    }


def test_without_a_key_every_call_is_a_new_job_and_the_dedupe_key_is_the_job_id(runtime):
    first = runtime.service.create_job(new_request()).job
    second = runtime.service.create_job(new_request()).job
    assert first.id != second.id
    assert (
        OutboxEvent.get(OutboxEvent.aggregate_id == first.id).dedupe_key
        == 'synthetic:user-a:%s' % first.id
    )


def test_same_key_same_request_returns_the_existing_job(runtime):
    first = runtime.service.create_job(new_request(key='k1', input={'a': 1}))
    replay = runtime.service.create_job(new_request(key='k1', input={'a': 1}))
    assert not replay.created and replay.job.id == first.job.id
    assert counts() == (1, 1, 1)


def test_same_key_different_request_is_refused(runtime):
    first = runtime.service.create_job(new_request(key='k1', input={'a': 1}))
    with pytest.raises(IdempotencyKeyReusedError) as raised:
        runtime.service.create_job(new_request(key='k1', input={'a': 2}))
    assert raised.value.job_id == first.job.id
    assert counts() == (1, 1, 1)


def test_the_key_is_scoped_per_user_and_job_type(runtime):
    a = runtime.service.create_job(new_request(key='k1', user_id='user-a')).job
    b = runtime.service.create_job(new_request(key='k1', user_id='user-b')).job
    assert a.id != b.id and counts() == (2, 2, 2)


EXACT_KEYS = ('abc', 'ABC', 'abc ')


def dedupe_keys():
    return sorted(e.dedupe_key for e in OutboxEvent.select())


def test_keys_that_differ_in_letter_case_or_a_trailing_space_are_three_jobs(runtime):
    created = [runtime.service.create_job(new_request(key=key)) for key in EXACT_KEYS]
    assert [r.created for r in created] == [True] * 3
    assert len({r.job.id for r in created}) == 3
    assert [AiJob.get_by_id(r.job.id).idempotency_key for r in created] == list(EXACT_KEYS)
    assert dedupe_keys() == sorted('synthetic:user-a:' + key for key in EXACT_KEYS)
    # Each key replays its own job, found by exact comparison.
    again = [runtime.service.create_job(new_request(key=key)) for key in EXACT_KEYS]
    assert [r.created for r in again] == [False] * 3
    assert [r.job.id for r in again] == [r.job.id for r in created]
    assert counts() == (3, 3, 3)


def test_initdb_makes_the_key_columns_of_an_older_database_exact(runtime):
    store = runtime.store
    if store.dialect != 'mysql':
        pytest.skip("SQLite's default collation compares keys exactly from the start")
    exact = store.exact_collation()
    assert exact == 'utf8mb4_nopad_bin'  # MariaDB's binary NO PAD collation
    for table, column, kind, nullability in EXACT_COLUMNS:
        assert store.column_collation(table, column) == exact
        # as a database created before: the server's case-insensitive default
        store.db.execute_sql(
            'ALTER TABLE %s MODIFY %s %s CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci %s'
            % (table, column, kind, nullability)
        )
    first = runtime.service.create_job(new_request(key='abc'))
    collided = runtime.service.create_job(new_request(key='ABC'))
    assert not collided.created and collided.job.id == first.job.id  # the old collision

    store.create_schema()  # initdb
    store.create_schema()  # twice: nothing left to change
    for table, column, _, nullability in EXACT_COLUMNS:
        assert store.column_collation(table, column) == exact
        nullable = store.db.execute_sql(
            'SELECT IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() '
            'AND TABLE_NAME = %s AND COLUMN_NAME = %s',
            (table, column),
        ).fetchone()[0]
        assert nullable == ('YES' if nullability == 'NULL' else 'NO')
    others = [runtime.service.create_job(new_request(key=key)) for key in EXACT_KEYS[1:]]
    assert [r.created for r in others] == [True, True]
    assert runtime.service.create_job(new_request(key='abc')).job.id == first.job.id
    assert counts() == (3, 3, 3)


def test_fifty_threads_with_one_key_make_one_job(runtime):
    results, errors = run_threads(
        50,
        lambda i: runtime.service.create_job(new_request(key='race', input={'x': 1})),
        runtime.store,
    )
    assert errors == [None] * 50
    assert len({r.job.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert counts() == (1, 1, 1)


def test_racing_creates_of_one_user_stop_exactly_at_the_limit(make_runtime):
    """Each create counts itself on its user's admission row, which it holds until its group
    commits (tests/kernel/core/test_admission.py has more): twenty racing requests for a user
    with room for five make five jobs, the others are refused and write nothing, whatever
    groups commit at once. Another user in the same groups is counted apart."""
    runtime = make_runtime(AIJOB_MAX_ACTIVE_JOBS_PER_USER='5')

    def create(i):
        user = 'user-a' if i % 4 else 'user-b'
        return runtime.service.create_job(new_request(user_id=user, input={'i': i}))

    with runtime.store.connection():
        results, errors = run_threads(20, create, runtime.store)
        refused = [e for e in errors if e is not None]
        assert {e.code for e in refused} == {'TOO_MANY_JOBS'}
        users = [r.job.user_id for r in results if r is not None]
        assert (users.count('user-a'), users.count('user-b')) == (5, 5)
        assert len(refused) == 10
        assert AiJob.select().where(AiJob.user_id == 'user-a').count() == 5
        assert counts() == (10, 10, 10)


def test_racing_creates_of_one_user_and_of_many_each_commit_once_in_a_group(runtime):
    """Creates from many threads, of one user and of many, each commit once through the
    creates' group commit, and the admission counters count each once."""
    run_threads(
        16, lambda i: runtime.service.create_job(new_request(input={'i': i})), runtime.store
    )
    run_threads(
        32,
        lambda i: runtime.service.create_job(new_request(user_id='user-%d' % i)),
        runtime.store,
    )
    assert runtime.service.creates.works == 48
    assert counts() == (48, 48, 48)
    assert active_counts() == {'user-a': 16, **{'user-%d' % i: 1 for i in range(32)}}


def active_counts():
    """Each user's unfinished jobs, as the admission counters say."""
    return {row.user_id: row.active for row in AiUserAdmission.select()}


def test_a_groups_admission_counts_go_last_so_a_users_row_is_locked_only_through_the_commit(
    runtime, monkeypatch
):
    """Two creates of one user committed as one group: every statement that counts them on
    the user's admission row comes after all the group's other rows. That upsert locks the row
    until the COMMIT, so sent last it holds it only through the commit, and creates of one
    user in concurrent groups do not wait through each other's inserts."""
    creates = runtime.service.creates = GroupCommit(
        runtime.store, after_commit=runtime.service._push_created, groups=1
    )
    sent = record_sent_statements(monkeypatch, runtime.store)
    gate, holding = threading.Event(), threading.Event()

    def held(tx):
        holding.set()
        gate.wait(10)

    def run_held():
        with runtime.store.connection():
            creates.run([held])

    def create(i):
        with runtime.store.connection():
            runtime.service.create_job(new_request(input={'i': i}))

    first = threading.Thread(target=run_held)
    first.start()
    assert holding.wait(10)  # the one group is taken: the next two creates wait as one group
    both = [threading.Thread(target=create, args=(i,)) for i in range(2)]
    for thread in both:
        thread.start()
    wait_until(lambda: len(creates._waiting) == 2)
    gate.set()
    for thread in [first, *both]:
        thread.join(10)
    assert (creates.groups, creates.works) == (2, 3)
    [group] = [texts for texts in sent if any('INSERT INTO ai_job ' in t for t in texts)]
    counting = [i for i, text in enumerate(group) if 'ai_user_admission' in text]
    upserts = [i for i in counting if group[i].startswith('INSERT')]
    assert len(upserts) == 2
    assert counting == list(range(len(group) - len(counting), len(group)))  # the last ones
    assert len(counting) < len(group)
    assert active_counts() == {'user-a': 2}


def test_a_failure_between_job_and_outbox_leaves_neither(runtime, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError('injected between the job insert and the outbox insert')

    monkeypatch.setattr(runtime.outbox, 'create_in_transaction', explode)
    with pytest.raises(RuntimeError):
        runtime.service.create_job(new_request(key='k1'))
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    'request_kwargs,error,field',
    [
        ({'job_type': 'nope'}, UnknownJobTypeError, None),
        ({'input': {'sleepMs': -1}}, InvalidInputError, 'input.sleepMs'),
        ({'input': {'failWith': 'NOT_A_CODE'}}, InvalidInputError, 'input.failWith'),
        ({'user_id': ''}, InvalidRequestError, 'userId'),
        ({'target_id': ''}, InvalidRequestError, 'targetId'),
        ({'key': 'x' * 256}, InvalidRequestError, 'idempotencyKey'),
        ({'overrides': {'priority': 101}}, InvalidRequestError, 'overrides.priority'),
        ({'overrides': {'status': 'succeeded'}}, InvalidRequestError, 'overrides.status'),
        (
            {'overrides': {'credentialMode': 'user_deepseek_key'}},
            InvalidRequestError,
            'overrides.credentialMode',
        ),
    ],
)
def test_invalid_requests_write_nothing(runtime, request_kwargs, error, field):
    with pytest.raises(error) as raised:
        runtime.service.create_job(new_request(**request_kwargs))
    if field is not None:
        assert raised.value.field == field and field in raised.value.public_message
    assert counts() == (0, 0, 0)


def test_overrides_set_priority_and_versions(runtime):
    job = runtime.service.create_job(
        new_request(overrides={'priority': 5, 'promptVersion': 'v2', 'outputSchemaVersion': 's2'})
    ).job
    assert (job.priority, job.prompt_version, job.output_schema_version) == (5, 'v2', 's2')
    assert OutboxEvent.get(OutboxEvent.aggregate_id == job.id).payload['priority'] == 5
