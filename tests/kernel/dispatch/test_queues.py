"""The queue contract, run against RedisQueue and MemoryQueue alike."""

import json
import threading
import time

import pytest
import redis

from engine.core.errors import QueueUnavailableError
from engine.dispatch.memory_queue import MemoryQueue
from engine.dispatch.queue import Message
from engine.dispatch.redis_queue import RedisQueue
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers


@pytest.fixture(params=['memory', 'redis'])
def queue(request):
    if request.param == 'memory':
        yield MemoryQueue()
        return
    require_servers('redis')
    prefix = 'aijob-test-queue-%d' % time.monotonic_ns()
    q = RedisQueue(REDIS_URL, prefix=prefix)
    yield q
    q.close()
    delete_redis_keys(prefix)


def message(job_id, priority=50, queue_name='ai-interactive'):
    return Message.for_job(job_id, 'synthetic', queue_name, priority)


def drain(queue, consumer='c1', queue_name='ai-interactive'):
    popped = []
    while True:
        delivery = queue.pop(queue_name, consumer, timeout_s=0.05)
        if delivery is None:
            return popped
        popped.append(delivery)


def test_push_is_idempotent_on_the_queue_job_id(queue):
    assert queue.push(message('j1')) is True
    assert queue.push(message('j1')) is False
    assert queue.has_entry(message('j1'))
    assert [d.message.job_id for d in drain(queue)] == ['j1']


def test_force_pushes_a_duplicate(queue):
    queue.push(message('j1'))
    assert queue.push(message('j1'), force=True) is True
    assert len(drain(queue)) == 2


def test_lower_priority_numbers_come_first_and_each_band_is_fifo(queue):
    for job_id, priority in [('low', 90), ('normal-1', 50), ('high', 0), ('normal-2', 50)]:
        queue.push(message(job_id, priority))
    assert [d.message.job_id for d in drain(queue)] == ['high', 'normal-1', 'normal-2', 'low']


def test_queues_are_separate(queue):
    queue.push(message('bg', queue_name='ai-background'))
    assert drain(queue) == []
    assert [d.message.job_id for d in drain(queue, queue_name='ai-background')] == ['bg']


def test_ack_forgets_the_message_so_it_can_be_published_again(queue):
    queue.push(message('j1'))
    [delivery] = drain(queue)
    assert queue.has_entry(message('j1'))  # being processed still counts as live
    queue.ack(delivery)
    assert not queue.has_entry(message('j1'))
    assert queue.push(message('j1')) is True


def test_release_puts_a_delivery_back_at_the_front(queue):
    queue.push(message('j1'))
    queue.push(message('j2'))
    first = queue.pop('ai-interactive', 'c1', timeout_s=0.1)
    queue.release(first)
    assert [d.message.job_id for d in drain(queue, consumer='c2')] == ['j1', 'j2']


def test_a_dead_consumers_messages_are_recovered(queue):
    queue.push(message('j1'))
    queue.heartbeat('dead-consumer', ttl_ms=50)
    queue.heartbeat('live-consumer', ttl_ms=60_000)
    assert queue.pop('ai-interactive', 'dead-consumer', timeout_s=0.1).message.job_id == 'j1'
    queue.push(message('j2'))
    assert queue.pop('ai-interactive', 'live-consumer', timeout_s=0.1).message.job_id == 'j2'
    assert queue.recover_orphans() == 0  # the dead one's heartbeat has not expired
    time.sleep(0.1)
    assert queue.recover_orphans() == 1  # only the dead consumer's message moves
    assert [d.message.job_id for d in drain(queue, consumer='c3')] == ['j1']


def test_pop_blocks_until_a_push_arrives(queue):
    threading.Timer(0.2, lambda: queue.push(message('late'))).start()
    delivery = queue.pop('ai-interactive', 'c1', timeout_s=10)
    assert delivery is not None and delivery.message.job_id == 'late'


def test_cancel_signals(queue):
    queue.signal_cancel('j1', ttl_s=60)
    assert queue.cancel_signalled(['j1', 'j2']) == {'j1'}


def test_messages_carry_ids_only(queue):
    queue.push(message('j1', priority=7))
    [delivery] = drain(queue)
    assert set(json.loads(delivery.raw)) == {
        'jobId',
        'jobType',
        'queueName',
        'priority',
        'idempotencyKey',
        'createdAt',
    }


def test_redis_errors_become_the_engines_own_error():
    q = RedisQueue('redis://127.0.0.1:1/0', prefix='nowhere')
    for call in (q.ping, lambda: q.push(message('j1')), lambda: q.pop('ai-interactive', 'c', 0.1)):
        with pytest.raises(QueueUnavailableError):
            call()
    assert not issubclass(QueueUnavailableError, redis.RedisError)


# ---------------------------------------------------------------- sharded Redis queues
@pytest.fixture
def sharded():
    """``sharded(n)``: RedisQueues with n shards over one key prefix (one deployment)."""
    require_servers('redis')
    prefix = 'aijob-test-shards-%d' % time.monotonic_ns()
    made = []

    def make(shards):
        made.append(RedisQueue(REDIS_URL, prefix=prefix, shards=shards))
        return made[-1]

    yield make
    for q in made:
        q.close()
    delete_redis_keys(prefix)


def ids_in(queue, tag, count, start=0, queue_name='ai-interactive'):
    """``count`` job ids whose messages ``queue`` puts in shard ``tag``."""
    found, n = [], start
    while len(found) < count:
        if queue.tag_of(message('j%d' % n, queue_name=queue_name)) == tag:
            found.append('j%d' % n)
        n += 1
    return found


def shard_lengths(queue, queue_name='ai-interactive'):
    return {
        tag: sum(queue.redis.llen(key) for key in queue._bands(tag, queue_name))
        for tag in queue.shard_tags()
    }


def test_a_shards_keys_carry_its_number_and_the_queues_name(sharded):
    """Shard s of every queue shares the hash tag {s}: one slot for a user's keys of both
    queues, and the key names of the layout before (a tag per queue) are never read."""
    q = sharded(1)
    q.push(message('j1'))
    q.push(message('j2', queue_name='ai-background'))
    assert q.redis.llen('%s:{0}:ai-interactive:band:1' % q.prefix) == 1
    assert q.redis.llen('%s:{0}:ai-background:band:1' % q.prefix) == 1


def test_jobs_spread_over_four_shards_and_each_is_popped_once(sharded):
    q = sharded(4)
    ids = ['j%d' % i for i in range(200)]
    for i, job_id in enumerate(ids):
        q.push(message(job_id, queue_name=('ai-interactive', 'ai-background')[i % 2]))
    for queue_name in ('ai-interactive', 'ai-background'):
        lengths = shard_lengths(q, queue_name)
        assert sorted(lengths) == ['0', '1', '2', '3']
        assert min(lengths.values()) >= 10, lengths  # a stable hash spreads the ids
    popped = [d.message.job_id for d in drain(q) + drain(q, queue_name='ai-background')]
    assert sorted(popped) == sorted(ids)


def test_a_busy_shard_does_not_starve_the_others(sharded):
    q = sharded(4)
    for job_id in ids_in(q, '0', 30):
        q.push(message(job_id))
    few = [ids_in(q, str(s), 2) for s in (1, 2, 3)]
    for job_id in sum(few, []):
        q.push(message(job_id))
    first = [q.pop('ai-interactive', 'c1', 0.1).message.job_id for _ in range(8)]
    assert set(sum(few, [])) <= set(first)  # each sweep starts at the next shard


def test_priority_bands_hold_within_a_shard(sharded):
    q = sharded(4)
    low, normal, high = ids_in(q, '2', 3)
    for job_id, priority in ((low, 90), (normal, 50), (high, 0)):
        q.push(message(job_id, priority))
    assert [d.message.job_id for d in drain(q)] == [high, normal, low]


def test_a_push_to_any_shard_wakes_a_blocked_pop(sharded):
    q = sharded(4)
    [late] = ids_in(q, '3', 1)
    threading.Timer(0.2, lambda: q.push(message(late))).start()
    began = time.monotonic()
    delivery = q.pop('ai-interactive', 'c1', timeout_s=30)
    # Before the pop's own timeout (30 s; the push comes at 0.2 s): the push woke it.
    assert delivery.message.job_id == late and time.monotonic() - began < 30


def test_going_from_four_shards_to_two_loses_nothing(sharded):
    before, after = sharded(4), sharded(2)
    ids = ['j%d' % i for i in range(40)]
    for job_id in ids:
        before.push(message(job_id))
    assert all(shard_lengths(before)[t] for t in ('2', '3'))
    # A consumer of the old deployment dies holding a message of shard 3.
    before.heartbeat('old-consumer', ttl_ms=50)
    [held] = ids_in(before, '3', 1)
    while True:
        delivery = before.pop('ai-interactive', 'old-consumer', 0.1)
        if delivery.message.job_id == held:
            break
        before.release(delivery)
    # The new deployment sees every message, those in shards it no longer pushes to included.
    assert after.depth('ai-interactive') == 39 and after.in_flight('ai-interactive') == 1
    assert after.has_entry(message(held))
    time.sleep(0.1)
    assert after.recover_orphans() == 1
    popped = drain(after, consumer='new-consumer')
    assert sorted(d.message.job_id for d in popped) == sorted(ids)
    for delivery in popped:
        after.ack(delivery)
    assert (after.depth('ai-interactive'), after.in_flight('ai-interactive')) == (0, 0)
    assert not after.has_entry(message(held))


def test_going_from_one_shard_to_four_drains_the_unsharded_lists(sharded):
    before, after = sharded(1), sharded(4)
    ids = ['j%d' % i for i in range(10)]
    for job_id in ids:
        before.push(message(job_id))
    assert sorted(d.message.job_id for d in drain(after)) == sorted(ids)


def test_pop_many_takes_up_to_its_limit_most_urgent_first_and_ack_many_forgets_them(queue):
    for job_id, priority in [('low', 90), ('n1', 50), ('high', 0), ('n2', 50), ('n3', 50)]:
        queue.push(message(job_id, priority))
    first = queue.pop_many('ai-interactive', 'c1', 3, timeout_s=0.1)
    assert [d.message.job_id for d in first] == ['high', 'n1', 'n2']
    assert queue.in_flight('ai-interactive') == 3 and queue.depth('ai-interactive') == 2
    queue.ack_many(first)
    assert queue.in_flight('ai-interactive') == 0
    assert not any(queue.has_entry(message(j)) for j in ('high', 'n1', 'n2'))
    assert queue.has_entry(message('n3'))
    rest = queue.pop_many('ai-interactive', 'c1', 10, timeout_s=0.1)
    assert [d.message.job_id for d in rest] == ['n3', 'low']
    assert queue.pop_many('ai-interactive', 'c1', 10, timeout_s=0.05) == []


def test_pop_many_waits_for_a_push(queue):
    threading.Timer(0.2, lambda: queue.push(message('late'))).start()
    deliveries = queue.pop_many('ai-interactive', 'c1', 5, timeout_s=10)
    assert [d.message.job_id for d in deliveries] == ['late']


def test_pop_many_sweeps_every_shard_and_ack_many_acks_each_in_its_own(sharded):
    q = sharded(4)
    ids = ['job-%d' % i for i in range(12)]
    for job_id in ids:
        q.push(message(job_id))
    assert len({q.tag_of(message(j)) for j in ids}) > 1
    taken = q.pop_many('ai-interactive', 'c1', 12, timeout_s=0.1)
    assert sorted(d.message.job_id for d in taken) == sorted(ids)
    q.ack_many(taken)
    assert q.in_flight('ai-interactive') == 0 and q.depth('ai-interactive') == 0
    assert not any(q.has_entry(message(j)) for j in ids)
