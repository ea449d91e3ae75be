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
