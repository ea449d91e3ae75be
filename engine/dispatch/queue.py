"""The queue contract (contracts §3): what every backend (redis_queue, memory_queue) does.

The database stays the source of truth (architecture decision 1): a queue only wakes a worker up,
and a duplicate message is harmless because ``lock_job`` is a compare-and-set. What a queue must not
do is lose a message when a consumer dies: a pop moves the message atomically into the consumer's
processing list, an ack removes it, and the processing list of a consumer whose heartbeat expired is
moved back (architecture decision 5).

Priority is honoured in three bands (0–32, 33–65, 66–100); lower numbers first. Within a band
the queue is fair per user (architecture, "Queues"): each user's messages wait in a list of their
own, FIFO, and consumers take from the users with messages waiting in turn (a user of weight w
takes up to w turns in a row). With a running cap (AIJOB_MAX_RUNNING_PER_USER) a user holding
that many messages in consumers' processing lists, of every queue together, is passed over in
every queue: their messages stay queued.
A message names its user by an opaque key (core/fairness.py), never the user id.
"""

import json
import time
from dataclasses import dataclass

from ..core.registry import QUEUE_NAMES

BANDS = 3


def band_of(priority):
    return min(BANDS - 1, max(0, int(priority)) * BANDS // 101)


def queue_job_id(queue_name, job_type, job_id):
    """contracts §3.2's ``{queueName}:{jobType}:{idempotencyKey}``. The job id stands in for the
    key: idempotency keys are scoped per user, so two users' keys could collide here, while the job
    id is exactly what a key resolves to."""
    return '%s:%s:%s' % (queue_name, job_type, job_id)


@dataclass(frozen=True)
class Message:
    """contracts §3.2's payload plus routing; ids only, never input, user id or credential.
    ``user_key`` is the user's opaque key (core/fairness.py; '' for a message pushed without
    one: it waits in its band's shared list, taken before the users' turns)."""

    job_id: str
    job_type: str
    queue_name: str
    priority: int
    created_at: float
    user_key: str = ''

    @property
    def queue_job_id(self):
        return queue_job_id(self.queue_name, self.job_type, self.job_id)

    def encode(self):
        data = {
            'jobId': self.job_id,
            'jobType': self.job_type,
            'queueName': self.queue_name,
            'priority': self.priority,
            'idempotencyKey': self.queue_job_id,
            'createdAt': self.created_at,
        }
        if self.user_key:
            data['userKey'] = self.user_key
        return json.dumps(data, separators=(',', ':'), sort_keys=True)

    @classmethod
    def decode(cls, raw):
        data = json.loads(raw)
        return cls(
            data['jobId'],
            data['jobType'],
            data['queueName'],
            int(data['priority']),
            float(data['createdAt']),
            str(data.get('userKey') or ''),
        )

    @classmethod
    def for_job(cls, job_id, job_type, queue_name, priority, user_key=''):
        if queue_name not in QUEUE_NAMES:
            raise ValueError('unknown queue %r' % (queue_name,))
        return cls(job_id, job_type, queue_name, int(priority), time.time(), user_key or '')


@dataclass(frozen=True)
class Delivery:
    """A message popped by a consumer; pass it back to ``ack`` or ``release``."""

    message: Message
    raw: str
    consumer_id: str
    source: str = ''  # the backend's note of where it took the message from (a Redis shard)


class Queue:
    """The contract every backend implements."""

    def push(self, message, force=False):
        """Enqueue unless a message with the same queue job id is already live (SET NX, like
        BullMQ's jobId). ``force`` pushes anyway (a takeover after a lost worker). Returns
        whether it pushed."""
        raise NotImplementedError

    def push_many(self, messages):
        """``push`` of several messages, in one round trip where the backend can. Returns one
        bool per message. If it raises, any prefix of the messages may have been pushed: callers
        hand every one back, and the idempotent push makes the second push of those harmless."""
        return [self.push(message) for message in messages]

    def pop(self, queue_name, consumer_id, timeout_s):
        """Move the next message into the consumer's processing list and return its Delivery,
        waiting up to ``timeout_s``; None if nothing came. The next message: the most urgent
        band first; within it the shared list, then the user whose turn it is (passing over
        users at the running cap)."""
        raise NotImplementedError

    def pop_many(self, queue_name, consumer_id, limit, timeout_s):
        """Up to ``limit`` deliveries, in ``pop``'s order (the users' turns move within the
        batch), each moved into the consumer's processing list as ``pop`` does; waits up to
        ``timeout_s`` for the first and not at all for the rest. Backends override it to take
        them in one round trip."""
        first = self.pop(queue_name, consumer_id, timeout_s)
        if first is None:
            return []
        deliveries = [first]
        while len(deliveries) < limit:
            more = self.pop(queue_name, consumer_id, 0)
            if more is None:
                break
            deliveries.append(more)
        return deliveries

    def ack(self, delivery):
        """Done with a delivery: remove it from processing and forget its queue job id."""
        raise NotImplementedError

    def ack_many(self, deliveries):
        """``ack`` of several deliveries, in one round trip where the backend can."""
        for delivery in deliveries:
            self.ack(delivery)

    def release(self, delivery):
        """Hand a delivery back to the front of its queue (graceful shutdown)."""
        raise NotImplementedError

    def heartbeat(self, consumer_id, ttl_ms):
        """Consumer ``consumer_id`` is alive for ``ttl_ms`` more."""
        raise NotImplementedError

    def recover_orphans(self):
        """Move back the processing lists of consumers whose heartbeat expired; return how many
        messages moved."""
        raise NotImplementedError

    def running(self, user_key):
        """Messages of this user (by user key) held in consumers' processing lists, over every
        queue: what AIJOB_MAX_RUNNING_PER_USER counts."""
        raise NotImplementedError

    def has_entry(self, message):
        """Is a message for this job live (queued or being processed)?"""
        raise NotImplementedError

    def epoch(self):
        """A token that stays the same while the backend keeps its data, and changes when it
        lost it (a Redis restarted without persistence): the first caller after a loss writes
        a new one."""
        raise NotImplementedError

    def signal_cancel(self, job_id, ttl_s=300):
        """The fast cancellation path (``job:cancel:{jobId}``, contracts §8.2)."""
        raise NotImplementedError

    def cancel_signalled(self, job_ids):
        """The subset of ``job_ids`` with a live cancel signal."""
        raise NotImplementedError

    def cancel_signals_sent(self):
        """A number that changes whenever ``signal_cancel`` is called anywhere: a worker asks
        ``cancel_signalled`` about the jobs it runs only when it moved, so its check costs one
        read however many jobs it runs."""
        raise NotImplementedError

    def depth(self, queue_name):
        """Messages waiting in a queue (not being processed), over all its shards."""
        raise NotImplementedError

    def in_flight(self, queue_name):
        """Messages of a queue held in consumers' processing lists, over all its shards."""
        raise NotImplementedError

    def shard_lengths(self, queue_name):
        """{shard: (waiting, processing)} of a queue, for the metrics: messages waiting and
        messages held in consumers' processing lists, per shard."""
        raise NotImplementedError

    def consumers(self):
        """The consumers whose heartbeat is live: ``{consumer_id: milliseconds it has left}``
        (the operator's "workers alive"; a consumer id is the worker's instance id, the
        ``locked_by`` of the jobs it runs)."""
        raise NotImplementedError

    def ping(self):
        """Raise QueueUnavailableError unless the backend answers."""
        raise NotImplementedError

    def check_ready(self):
        """Raise QueueUnavailableError unless the backend takes writes wherever this queue's
        messages live (``/readyz``): answering is not enough, a read-only replica answers too.
        An in-process queue is ready when it answers."""
        self.ping()

    def close(self):
        pass


# ---------------------------------------------------------------- Redis
