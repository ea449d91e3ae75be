"""The redis-py client for AIJOB_REDIS_URL's topology (issue 13 item 1): ``redis.Redis`` for one
server, ``RedisCluster`` for a cluster, ``Sentinel.master_for`` for a Sentinel-watched master.

Only the dispatch layer's Redis modules use it (the queue, the live text's channel); everything
above sees their contracts. ``translate_errors`` keeps the driver's errors at that edge.
"""

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from ..core.errors import QueueUnavailableError
from ..core.redis_url import CLUSTER, SENTINEL, parse_redis_url

# The same timeouts on every topology: a dead node fails a call within seconds, never hangs it.
SOCKET_TIMEOUT_S = 10
CONNECT_TIMEOUT_S = 3
HEALTH_CHECK_S = 30
# A call retries a dropped connection a few times within a second (a closed idle socket, a
# Sentinel client reaching the new master), then fails: the engine's loops retry at their own
# pace, and /readyz answers. redis-py's default (10 retries) makes a call to an unreachable host
# last 10 connect timeouts.
RETRIES = 3
# Connections one client keeps, per server: a caller that finds them all in use waits for one
# (up to POOL_WAIT_S) instead of failing. A worker's blocking pops are its fetchers' (one per
# queue) and everything else holds a connection for one command, so thousands of jobs share a
# few dozen; redis-py's default pool would fail a call at once beyond 100.
POOL_SIZE = 32
POOL_WAIT_S = 20


def translate_errors(method):
    """Driver errors stop at this edge as QueueUnavailableError (as dramatiq does): a method
    decorated with it raises nothing of redis-py's."""

    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (redis.RedisError, RedisClusterException) as exc:
            # RedisClusterException (no node answers, a slot uncovered) is no RedisError.
            raise QueueUnavailableError('redis: %s' % exc.__class__.__name__) from None

    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


def _retry():
    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), RETRIES)


def connect(url):
    """A client for ``url`` (decoded strings). Building it contacts no server except for a
    cluster, whose slot map is read at once: callers build it when first needed."""
    target = parse_redis_url(url)
    common = dict(
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        decode_responses=True,
    )
    if target.kind == CLUSTER:
        # redis-py's cluster client builds its nodes' pools itself (a blocking one only from a
        # URL): each stops at 100 connections. It retries on its own (3 times, with a fresh
        # slot map each time).
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            username=target.username,
            password=target.password,
            **common,
        )
    common['retry'] = _retry()
    if target.kind == SENTINEL:
        # redis-py has no blocking pool for a Sentinel-managed master: its pool stops at 100.
        return _sentinel_master(target, common)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=POOL_SIZE,
        timeout=POOL_WAIT_S,
        health_check_interval=HEALTH_CHECK_S,
        **common,
    )
    return redis.Redis(connection_pool=pool)


class FollowingConnection(SentinelManagedConnection):
    """A Sentinel-managed connection that asks the sentinels for the master on every
    reconnect. redis-py 8.1's asks only when the pool hands a connection out: a command's own
    retries (after a ConnectionError, or a ReadOnlyError it turns into one) reconnect through
    ``send_packed_command`` to the address the connection had, the old master, so every retry
    of that call fails READONLY or refused, or writes to a master about to be demoted."""

    def send_packed_command(self, command, check_health=True):
        if not self._sock:
            self.connect()  # SentinelManagedConnection.connect: the master as named now
        super().send_packed_command(command, check_health)


def _sentinel_master(target, common):
    """The master of ``target.service``. Every (re)connection asks the sentinels for the
    master's address, and a command that finds the server read-only (a demoted master) drops
    its connection: after a failover the next call, or the next retry of this one, reaches the
    new master."""
    sentinel = Sentinel(
        list(target.nodes),
        sentinel_kwargs=dict(
            socket_timeout=CONNECT_TIMEOUT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            password=target.sentinel_password,
            retry=_retry(),
        ),
    )
    return sentinel.master_for(
        target.service,
        db=target.db,
        username=target.username,
        password=target.password,
        health_check_interval=HEALTH_CHECK_S,
        connection_class=FollowingConnection,
        **common,
    )


def is_cluster(client):
    return isinstance(client, RedisCluster)
