"""The busiest users (engine/core/busiest_users.py): jobs waiting and running per user, the age
of the oldest waiting job, and the create→running wait quantiles over the window, exactly, for a
crafted set of jobs; the top-N bound, the running users who fill it, the cap on the waits read,
and the index every read goes through. Both backend pairs."""

from engine.core import busiest_users as module
from engine.core.busiest_users import INDEX, busiest_users, quantile
from tests.support.busy_users import (
    EXPECTED,
    OLDEST_WAITING_S,
    ORDER,
    SECOND,
    craft,
    queued,
    started,
)


def as_dict(load):
    return {
        'waiting': load.waiting,
        'running': load.running,
        'waits': load.waits,
        'p50': load.wait_p50_s,
        'p95': load.wait_p95_s,
    }


def test_counts_and_waits_of_the_busiest_users_exactly(engine_rt):
    craft(engine_rt)
    loads = busiest_users(engine_rt.store)
    assert [load.user_id for load in loads] == ORDER
    assert {load.user_id: as_dict(load) for load in loads} == EXPECTED
    for load in loads:
        oldest = OLDEST_WAITING_S.get(load.user_id)
        if oldest is None:
            assert load.oldest_waiting_s == 0.0
        else:  # the age grows with the clock from when the test wrote it
            assert oldest <= load.oldest_waiting_s < oldest + 30


def test_only_the_first_n_users_are_listed_most_waiting_first(engine_rt):
    rt = engine_rt
    now = rt.store.clock()
    for n in range(1, 5):  # user-1 has 1 job waiting … user-4 has 4
        for _ in range(n):
            queued(rt, 'user-%d' % n, 1, now)
    started(rt, 'user-running', 1, now, finish=False)
    assert [load.user_id for load in busiest_users(rt.store, limit=3)] == [
        'user-4',
        'user-3',
        'user-2',
    ]
    # Fewer users wait than the limit: users with running jobs fill it.
    assert [load.user_id for load in busiest_users(rt.store, limit=6)] == [
        'user-4',
        'user-3',
        'user-2',
        'user-1',
        'user-running',
    ]


def test_the_waits_read_are_the_latest_starts_in_the_window_at_most(engine_rt, monkeypatch):
    rt = engine_rt
    now = rt.store.clock()
    queued(rt, 'user-a', 1, now)  # busy: one job waiting
    for i, wait_s in enumerate((9, 8, 7, 1, 2)):  # the 3 latest starts waited 7, 1 and 2 s
        started(rt, 'user-a', wait_s, now - (10 - i) * SECOND)
    monkeypatch.setattr(module, 'MAX_WAITS', 3)
    (load,) = busiest_users(rt.store)
    assert (load.waits, load.wait_p50_s, load.wait_p95_s) == (3, 2.0, 7.0)


def test_nearest_rank_quantiles():
    assert quantile([], 0.5) is None
    assert quantile([4.0], 0.95) == 4.0
    ordered = [float(n) for n in range(1, 21)]
    assert (quantile(ordered, 0.5), quantile(ordered, 0.95)) == (10.0, 19.0)
    assert quantile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_initdb_adds_the_index_to_an_older_database(runtime):
    on = ' ON ai_job' if runtime.store.dialect == 'mysql' else ''
    runtime.store.db.execute_sql('DROP INDEX %s%s' % (INDEX, on))
    assert INDEX not in {i.name for i in runtime.store.db.get_indexes('ai_job')}
    runtime.create_schema()
    assert INDEX in {i.name for i in runtime.store.db.get_indexes('ai_job')}


def test_initdb_drops_the_index_the_admission_counters_replaced(runtime):
    """ai_job (user_id, lifecycle_status) of an older database goes: nothing reads it, and the
    busiest users' index took its place on the status writes."""
    old = 'ai_job_user_id_lifecycle_status'
    runtime.store.db.execute_sql('CREATE INDEX %s ON ai_job (user_id, lifecycle_status)' % old)
    assert old in {i.name for i in runtime.store.db.get_indexes('ai_job')}
    runtime.create_schema()
    assert old not in {i.name for i in runtime.store.db.get_indexes('ai_job')}
    runtime.create_schema()  # safe to run twice
