"""Fair queues (issue 33, item 4): within each queue and priority band consumers take users'
messages in turn, a user of weight w up to w in a row; on RedisQueue and MemoryQueue alike,
with today's guarantees (processing list, ack, release, orphan recovery, has_entry) whole."""

import itertools
import threading
import time

import pytest

from engine.core.fairness import user_key
from engine.core.outbox import WAKE_EVENT
from engine.dispatch.housekeeping import message_for_job
from engine.dispatch.memory_queue import MemoryQueue
from engine.dispatch.queue import Message, band_of
from engine.dispatch.redis_queue import RedisQueue
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers
from tests.support.helpers import create_job

_ids = itertools.count()


@pytest.fixture(params=['memory', 'redis'])
def make_queue(request):
    """``make_queue(shards=1, **fair)``: a queue of the parametrized backend."""
    made, prefix = [], 'aijob-test-fair-%d' % time.monotonic_ns()

    def make(shards=1, **fair):
        if request.param == 'memory':
            made.append(MemoryQueue(**fair))
        else:
            require_servers('redis')
            made.append(RedisQueue(REDIS_URL, prefix=prefix, shards=shards, **fair))
        return made[-1]

    yield make
    for q in made:
        q.close()
    if request.param == 'redis':
        delete_redis_keys(prefix)


def message(user, priority=50, queue_name='ai-interactive'):
    job_id = '%s-%d' % (user, next(_ids))
    return Message.for_job(job_id, 'synthetic', queue_name, priority, user_key(user))


def push(queue, user, count, priority=50, queue_name='ai-interactive'):
    messages = [message(user, priority, queue_name) for _ in range(count)]
    for m in messages:
        assert queue.push(m)
    return messages


def owner(delivery):
    return delivery.message.job_id.rsplit('-', 1)[0]


def pops(queue, count, consumer='c1', queue_name='ai-interactive'):
    taken = []
    for _ in range(count):
        delivery = queue.pop(queue_name, consumer, timeout_s=0.05)
        if delivery is None:
            break
        taken.append(delivery)
    return taken


def test_a_user_with_one_job_behind_one_with_fifty_comes_within_two_pops(make_queue):
    queue = make_queue()
    push(queue, 'a', 50)
    push(queue, 'b', 1)
    first = [owner(d) for d in pops(queue, 2)]
    assert 'b' in first
    assert [owner(d) for d in pops(queue, 100)] == ['a'] * 49


def test_users_take_turns_and_each_users_jobs_stay_in_order(make_queue):
    queue = make_queue()
    pushed = {user: push(queue, user, 3) for user in ('a', 'b', 'c')}
    taken = pops(queue, 10)
    assert [owner(d) for d in taken] == ['a', 'b', 'c'] * 3
    for user, messages in pushed.items():
        mine = [d.message.job_id for d in taken if owner(d) == user]
        assert mine == [m.job_id for m in messages]


def test_a_weight_gives_that_many_turns_in_a_row(make_queue):
    queue = make_queue(user_weights={'a': 3})
    push(queue, 'a', 7)
    push(queue, 'b', 3)
    assert ''.join(owner(d) for d in pops(queue, 10)) == 'aaabaaabab'


def test_priority_still_comes_first(make_queue):
    queue = make_queue()
    push(queue, 'a', 3, priority=50)
    push(queue, 'b', 1, priority=90)
    push(queue, 'c', 1, priority=0)
    assert [owner(d) for d in pops(queue, 5)] == ['c', 'a', 'a', 'a', 'b']


def test_a_batch_pop_takes_turns_too(make_queue):
    queue = make_queue()
    push(queue, 'a', 10)
    push(queue, 'b', 2)
    batch = queue.pop_many('ai-interactive', 'c1', 5, timeout_s=0.1)
    assert [owner(d) for d in batch] == ['a', 'b', 'a', 'b', 'a']
    queue.ack_many(batch)
    assert queue.in_flight('ai-interactive') == 0 and queue.depth('ai-interactive') == 7


def taken_in_batches(queue, size, count):
    """``count`` messages taken by pop_many of ``size`` (acked as taken), as a string of owners."""
    order = ''
    while len(order) < count:
        batch = queue.pop_many('ai-interactive', 'c1', min(size, count - len(order)), 0.05)
        if not batch:
            break
        order += ''.join(owner(d) for d in batch)
        queue.ack_many(batch)
    return order


def burst_then_newcomers(queue, size):
    """A alone, then W (weight 3) mid-burst, then B: the order each stage takes, in batches."""
    push(queue, 'a', 25)
    first = taken_in_batches(queue, size, 9)
    push(queue, 'w', 12)
    second = taken_in_batches(queue, size, 10)
    push(queue, 'b', 4)
    return first, second, taken_in_batches(queue, size, 100)


@pytest.mark.parametrize('size', [2, 7, 40])
@pytest.mark.parametrize('cap', [0, 40])
def test_a_batch_pop_leaves_the_turns_as_single_pops_would(make_queue, size, cap):
    """A burst taken in batches (a user alone takes its turns in a row in one visit; a weighted
    user the rest of its turn) orders everything after it as pops of one message would: the
    same users' turns, rounds and weights when newcomers arrive mid-burst."""
    fair = {'user_weights': {'w': 3}, 'max_running_per_user': cap}
    one_by_one = burst_then_newcomers(make_queue(**fair), 1)
    assert burst_then_newcomers(make_queue(**fair), size) == one_by_one
    assert one_by_one[0] == 'a' * 9 and one_by_one[1].startswith('wwwa')


def test_messages_name_their_user_by_an_opaque_key_only(make_queue):
    queue = make_queue()
    queue.push(Message.for_job('j1', 'synthetic', 'ai-interactive', 50, user_key('alice@x.org')))
    [delivery] = pops(queue, 1)
    assert 'alice' not in delivery.raw
    assert delivery.message.user_key == user_key('alice@x.org')
    assert len(delivery.message.user_key) == 16


def test_ack_release_and_has_entry_hold(make_queue):
    queue = make_queue()
    [a1, a2] = push(queue, 'a', 2)
    [b1] = push(queue, 'b', 1)
    first = queue.pop('ai-interactive', 'c1', 0.1)
    assert first.message == a1 and queue.has_entry(a1)  # being processed is live
    assert queue.in_flight('ai-interactive') == 1 and queue.depth('ai-interactive') == 2
    queue.release(first)  # back to the front, and its user's turn with it
    taken = pops(queue, 3, consumer='c2')
    assert [d.message for d in taken] == [a1, b1, a2]
    queue.ack_many(taken)
    assert queue.in_flight('ai-interactive') == 0  # the release left nothing behind


def test_ack_forgets_the_message(make_queue):
    queue = make_queue()
    [a1] = push(queue, 'a', 1)
    [delivery] = pops(queue, 1)
    queue.ack(delivery)
    assert not queue.has_entry(a1)
    assert queue.push(a1) is True
    assert (queue.depth('ai-interactive'), queue.in_flight('ai-interactive')) == (1, 0)


def test_a_dead_consumers_messages_come_back_first_in_their_users_turn(make_queue):
    queue = make_queue()
    queue.heartbeat('dead', ttl_ms=50)
    a = push(queue, 'a', 3)
    b = push(queue, 'b', 2)
    held = queue.pop_many('ai-interactive', 'dead', 2, timeout_s=0.1)
    assert [d.message for d in held] == [a[0], b[0]]
    time.sleep(0.1)  # the dead consumer's heartbeat lapses (ttl 50 ms)
    assert queue.recover_orphans() == 2
    taken = [d.message for d in pops(queue, 10, consumer='c2')]
    assert sorted(m.job_id for m in taken) == sorted(m.job_id for m in a + b)
    assert [m for m in taken if m in a] == a and [m for m in taken if m in b] == b
    assert set(taken[:2]) == {a[0], b[0]}  # the recovered ones lead


# ---------------------------------------------------------------- the running cap at the queue
def test_a_user_at_the_running_cap_is_passed_over_until_an_ack(make_queue):
    queue = make_queue(max_running_per_user=2)
    push(queue, 'a', 5)
    push(queue, 'b', 1)
    taken = pops(queue, 5)
    assert sorted(owner(d) for d in taken) == ['a', 'a', 'b']  # a's third waits
    assert queue.running(user_key('a')) == 2
    queue.ack(taken[0] if owner(taken[0]) == 'a' else taken[1])
    assert [owner(d) for d in pops(queue, 5)] == ['a']
    assert queue.depth('ai-interactive') == 2


def test_a_batch_pop_stops_at_the_cap(make_queue):
    queue = make_queue(max_running_per_user=3)
    push(queue, 'a', 10)
    batch = queue.pop_many('ai-interactive', 'c1', 10, timeout_s=0.1)
    assert len(batch) == 3
    queue.release(batch[0])  # handed back: the count drops with it
    assert len(queue.pop_many('ai-interactive', 'c2', 10, timeout_s=0.1)) == 1


def test_an_ack_wakes_a_consumer_waiting_on_a_capped_user(make_queue):
    queue = make_queue(max_running_per_user=1)
    push(queue, 'a', 2)
    [first] = pops(queue, 1)
    assert pops(queue, 1) == []
    threading.Timer(0.2, lambda: queue.ack(first)).start()
    began = time.monotonic()
    second = queue.pop('ai-interactive', 'c2', timeout_s=30)
    # Woken by the ack: sooner than the Redis queue's own re-check (it blocks 5 s at most).
    assert second is not None and time.monotonic() - began < 4


def test_a_dead_consumers_running_count_is_released(make_queue):
    queue = make_queue(max_running_per_user=1)
    queue.heartbeat('dead', ttl_ms=50)
    push(queue, 'a', 2)
    assert len(queue.pop_many('ai-interactive', 'dead', 5, timeout_s=0.1)) == 1
    assert pops(queue, 1, consumer='c2') == []
    time.sleep(0.1)
    assert queue.recover_orphans() == 1
    assert queue.running(user_key('a')) == 0
    assert len(pops(queue, 5, consumer='c2')) == 1  # one at a time still


def test_redis_counts_running_again_from_the_processing_lists():
    """A count left wrong (a Redis that lost keys, a process killed between scripts) is
    repaired by the reaper's pass: counted again from the live consumers' lists."""
    require_servers('redis')
    prefix = 'aijob-test-fair-recount-%d' % time.monotonic_ns()
    queue = RedisQueue(REDIS_URL, prefix=prefix, max_running_per_user=2)
    try:
        queue.heartbeat('c1', ttl_ms=60_000)
        push(queue, 'a', 3)
        assert len(pops(queue, 3)) == 2
        running = queue._key('0', 'running')
        queue.redis.hset(running, user_key('a'), 9)  # drifted
        queue.redis.hset(running, user_key('ghost'), 4)
        assert queue.recover_orphans() == 0
        assert queue.redis.hgetall(running) == {user_key('a'): '2'}
    finally:
        queue.close()
        delete_redis_keys(prefix)


# ---------------------------------------------------------------- the cap across the queues
BOTH = ('ai-interactive', 'ai-background')


@pytest.mark.parametrize('shards', [1, 4])
def test_the_cap_counts_a_users_jobs_in_both_queues_together(make_queue, shards):
    queue = make_queue(shards=shards, max_running_per_user=2)
    push(queue, 'a', 3, queue_name='ai-interactive')
    push(queue, 'a', 3, queue_name='ai-background')
    push(queue, 'b', 1, queue_name='ai-background')
    held = pops(queue, 5, queue_name='ai-interactive')
    assert [owner(d) for d in held] == ['a', 'a']
    # a holds 2 already: in the other queue a is passed over, b is not.
    assert [owner(d) for d in pops(queue, 5, queue_name='ai-background')] == ['b']
    assert queue.running(user_key('a')) == 2
    queue.ack(held[0])
    [bg] = pops(queue, 5, consumer='c2', queue_name='ai-background')
    assert owner(bg) == 'a' and queue.running(user_key('a')) == 2
    assert pops(queue, 5, queue_name='ai-interactive') == []
    queue.release(bg)  # handed back: the count drops with it, in whichever queue
    assert [owner(d) for d in pops(queue, 5, queue_name='ai-interactive')] == ['a']
    assert queue.depth('ai-interactive') == 0 and queue.depth('ai-background') == 3
    assert queue.running(user_key('a')) == 2


def test_a_batch_pop_stops_at_the_cap_counted_over_both_queues(make_queue):
    queue = make_queue(max_running_per_user=3)
    push(queue, 'a', 5, queue_name='ai-background')
    push(queue, 'a', 5, queue_name='ai-interactive')
    assert len(queue.pop_many('ai-background', 'c1', 2, timeout_s=0.1)) == 2
    assert len(queue.pop_many('ai-interactive', 'c1', 10, timeout_s=0.1)) == 1
    assert queue.pop_many('ai-background', 'c1', 10, timeout_s=0.05) == []


def test_an_ack_in_one_queue_wakes_a_consumer_of_the_other(make_queue):
    queue = make_queue(max_running_per_user=1)
    push(queue, 'a', 1, queue_name='ai-interactive')
    push(queue, 'a', 1, queue_name='ai-background')
    [first] = pops(queue, 1, queue_name='ai-interactive')
    assert pops(queue, 1, queue_name='ai-background') == []
    threading.Timer(0.2, lambda: queue.ack(first)).start()
    began = time.monotonic()
    second = queue.pop('ai-background', 'c2', timeout_s=30)
    # Woken by the ack: sooner than the Redis queue's own re-check (it blocks 5 s at most).
    assert second is not None and time.monotonic() - began < 4


def test_a_dead_consumers_jobs_in_one_queue_free_the_cap_in_the_other(make_queue):
    queue = make_queue(max_running_per_user=1)
    queue.heartbeat('dead', ttl_ms=50)
    queue.heartbeat('c2', ttl_ms=60_000)
    [held] = push(queue, 'a', 1, queue_name='ai-interactive')
    push(queue, 'a', 1, queue_name='ai-background')
    assert [d.message for d in pops(queue, 1, consumer='dead')] == [held]
    assert pops(queue, 1, consumer='c2', queue_name='ai-background') == []
    time.sleep(0.1)  # the dead consumer's heartbeat lapses (ttl 50 ms)
    assert queue.recover_orphans() == 1
    assert queue.running(user_key('a')) == 0
    assert len(pops(queue, 5, consumer='c2', queue_name='ai-background')) == 1
    assert pops(queue, 5, consumer='c2') == []  # the recovered one waits: a is at 1 again


@pytest.mark.parametrize('shards', [1, 4])
def test_racing_consumers_of_both_queues_never_hold_more_than_the_cap(make_queue, shards):
    race_both_queues(make_queue(shards=shards, max_running_per_user=2), cap=2)


def race_both_queues(queue, cap):
    """Six consumers, three per queue, pop and ack one user's messages as fast as they can:
    what they hold at once (counted between each pop's return and its ack, so never more than
    the queue counted) stays within the cap, and every message is taken once."""
    pushed = push(queue, 'a', 40, queue_name='ai-interactive')
    pushed += push(queue, 'a', 40, queue_name='ai-background')
    lock, holding, most, taken = threading.Lock(), [0], [0], []

    def consume(queue_name, consumer):
        idle = 0
        while idle < 3:
            delivery = queue.pop(queue_name, consumer, timeout_s=0.2)
            if delivery is None:
                idle += 1
                continue
            idle = 0
            with lock:
                holding[0] += 1
                most[0] = max(most[0], holding[0])
                taken.append(delivery.message)
            time.sleep(0.005)  # the job's run
            with lock:
                holding[0] -= 1
            queue.ack(delivery)

    threads = [
        threading.Thread(target=consume, args=(name, '%s-%d' % (name, i)))
        for name in BOTH
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(m.job_id for m in taken) == sorted(m.job_id for m in pushed)
    assert 1 <= most[0] <= cap
    assert queue.running(user_key('a')) == 0


def test_redis_counts_running_again_over_both_queues():
    """The reaper's recount sees a user's messages in the processing lists of every queue."""
    require_servers('redis')
    prefix = 'aijob-test-fair-recount2-%d' % time.monotonic_ns()
    queue = RedisQueue(REDIS_URL, prefix=prefix, shards=4, max_running_per_user=5)
    try:
        queue.heartbeat('c1', ttl_ms=60_000)
        [one] = push(queue, 'a', 1, queue_name='ai-interactive')
        push(queue, 'a', 1, queue_name='ai-background')
        assert len(pops(queue, 1)) == len(pops(queue, 1, queue_name='ai-background')) == 1
        running = queue._key(queue.tag_of(one), 'running')
        queue.redis.delete(running)  # lost
        assert queue.recover_orphans() == 0
        assert queue.redis.hgetall(running) == {user_key('a'): '2'}
        assert queue.running(user_key('a')) == 2
    finally:
        queue.close()
        delete_redis_keys(prefix)


# ---------------------------------------------------------------- shards
def test_a_users_messages_share_one_shard_and_turns_hold_across_shards(make_queue):
    queue = make_queue(shards=4)
    a = push(queue, 'a', 40)
    push(queue, 'b', 1)
    if isinstance(queue, RedisQueue):
        assert len({queue.tag_of(m) for m in a}) == 1
    first = [owner(d) for d in pops(queue, 3)]
    assert 'b' in first


def test_messages_without_a_user_key_are_still_taken(make_queue):
    """Events written before fair queues (or without a user) give messages without a key: they
    wait in their band's shared list and are taken before the users' turns."""
    queue = make_queue()
    push(queue, 'a', 2)
    legacy = Message.for_job('old-1', 'synthetic', 'ai-interactive', 50)
    queue.push(legacy)
    taken = pops(queue, 5)
    assert [d.message for d in taken][0] == legacy and len(taken) == 3
    queue.ack_many(taken)
    assert (queue.depth('ai-interactive'), queue.in_flight('ai-interactive')) == (0, 0)


# ---------------------------------------------------------------- end to end: the dispatcher
def test_an_event_without_a_user_key_gets_its_users_from_the_jobs_row(engine_rt):
    """A wake-up written by a writer that does not know the user (a provider batch's) or an
    event written before fair queues: the dispatcher reads the job's user, so the message takes
    that user's turns and counts toward the cap."""
    rt = engine_rt
    job = create_job(rt, user_id='user-w', target_id='w')
    rt.dispatcher.cycle()  # the create's own event
    for delivery in pops(rt.queue, 5):
        rt.queue.ack(delivery)
    with rt.store.atomic() as tx:
        rt.outbox.create_in_transaction(
            tx,
            event_type=WAKE_EVENT,
            aggregate_type='AiJob',
            aggregate_id=job.id,
            dedupe_key='wake:%s:batch' % job.id,
            payload={
                'jobId': job.id,
                'jobType': job.job_type,
                'queueName': job.queue_name,
                'priority': job.priority,
            },
        )
    assert rt.dispatcher.cycle() == 1
    [delivery] = pops(rt.queue, 5)
    assert (delivery.message.job_id, delivery.message.user_key) == (job.id, user_key('user-w'))


# ---------------------------------------------------------------- end to end: the reconciler
def test_the_reconciler_rebuilds_the_users_turns_after_redis_lost_its_keys(engine_rt):
    rt = engine_rt
    jobs = [create_job(rt, user_id='user-a', target_id='n%d' % i) for i in range(6)]
    jobs.append(create_job(rt, user_id='user-b', target_id='nb'))
    rt.dispatcher.cycle()  # the outbox's events (each with its user's key) to the queue
    assert rt.queue.depth('ai-interactive') == 7
    if isinstance(rt.queue, RedisQueue):
        delete_redis_keys(rt.config.redis_prefix)  # Redis restarted empty
    else:
        rt.queue.clear()
    assert rt.queue.depth('ai-interactive') == 0
    rt.reconciler.check_epoch()  # the first look: remembers the epoch
    assert rt.reconciler.sweep(after_ms=0) == 7
    taken = pops(rt.queue, 7)
    users = [d.message.user_key for d in taken]
    assert user_key('user-b') in users[:2]
    assert sorted(d.message.job_id for d in taken) == sorted(j.id for j in jobs)


def test_the_reconciler_publishes_again_what_the_key_layout_before_held(engine_rt):
    """The upgrade to shard tags shared by the queues: messages left under the keys of the
    version before (a hash tag per queue) are never read; the jobs are still queued in the
    database, so the reconciler publishes them again under the new keys."""
    rt = engine_rt
    if not isinstance(rt.queue, RedisQueue):
        pytest.skip('the in-process queue keeps no keys: a restart empties it')
    jobs = [create_job(rt, user_id='user-%d' % (i % 2), target_id='u%d' % i) for i in range(4)]
    delete_redis_keys(rt.config.redis_prefix)  # a process of the version before pushed them:
    for job in jobs:  # its keys, its registry
        message = message_for_job(job)
        old = '%s:{%s}' % (rt.config.redis_prefix, message.queue_name)
        band = '%s:band:%d:u:%s' % (old, band_of(message.priority), message.user_key)
        rt.queue.redis.rpush(band, message.encode())
        rt.queue.redis.set('%s:job:%s' % (old, message.queue_job_id), message.encode())
        rt.queue.redis.sadd('%s:shards:%s' % (rt.config.redis_prefix, message.queue_name), old)
    assert not any(rt.queue.has_entry(message_for_job(job)) for job in jobs)
    assert rt.queue.depth('ai-interactive') == 0
    assert rt.reconciler.sweep(after_ms=0) == 4
    taken = pops(rt.queue, 10)
    assert sorted(d.message.job_id for d in taken) == sorted(j.id for j in jobs)


def test_a_newcomer_goes_before_a_user_already_served_in_this_round(make_queue):
    """A alone was served three times; B and C arrive: their first messages go before A's next
    (they join the round being served; A's turn ended and moved it to the next)."""
    queue = make_queue()
    push(queue, 'a', 10)
    assert [owner(d) for d in pops(queue, 3)] == ['a', 'a', 'a']
    push(queue, 'b', 2)
    push(queue, 'c', 2)
    assert [owner(d) for d in pops(queue, 6)] == ['b', 'c', 'a', 'b', 'c', 'a']


def test_a_lost_round_key_gives_a_newcomer_one_turn_ahead_not_every_turn():
    """Redis lost ``band:N:round`` alone (an eviction): a newcomer joins at most one round
    behind the head, so it goes first once, then takes turns."""
    require_servers('redis')
    prefix = 'aijob-test-fair-round-%d' % time.monotonic_ns()
    queue = RedisQueue(REDIS_URL, prefix=prefix)
    try:
        push(queue, 'a', 30)
        assert len(pops(queue, 20)) == 20  # a's round is 20 now
        queue.redis.delete(queue._bands('0', 'ai-interactive')[1] + ':round')
        push(queue, 'b', 5)
        assert ''.join(owner(d) for d in pops(queue, 6)) == 'bababa'
    finally:
        queue.close()
        delete_redis_keys(prefix)
