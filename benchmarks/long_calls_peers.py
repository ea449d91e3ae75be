"""The peers' side of ``long_calls.py``, imported in the peers' virtualenv (requirements.txt
beside it) by their worker commands and by the enqueuing process. LONG_CALLS_PEER picks the
framework (dramatiq, celery, huey), LONG_CALLS_REDIS_URL the broker; with LONG_CALLS_STREAM_URL
each job reads a streamed completion from the loopback server (long_calls_server.py) instead of
sleeping. LONG_CALLS_CONNECTIONS bounds each peer's Redis connections: redis-py 8 limits a pool
to 100 by default and then raises, so every peer gets one pool of that many connections that
waits for a free one instead (long_calls.py sets it to the concurrency plus a few, as the
unbounded pools of earlier redis-py versions allowed). Every job appends "enqueued started
finished" (epoch seconds) to the Redis list DONE: the figures are read from there, the same
way for every peer."""

import http.client
import json
import os
import time
from urllib.parse import urlsplit

import redis

PEER = os.environ.get('LONG_CALLS_PEER', 'dramatiq')
URL = os.environ['LONG_CALLS_REDIS_URL']
STREAM_URL = os.environ.get('LONG_CALLS_STREAM_URL', '')
DONE = 'long-calls:done'
FIRST = 'long-calls:first'

CONNECTIONS = int(os.environ.get('LONG_CALLS_CONNECTIONS', '100'))

_pool = redis.BlockingConnectionPool.from_url(URL, max_connections=CONNECTIONS, timeout=None)
_redis = redis.Redis(connection_pool=_pool)


def run_job(enqueued_at, sleep_s, marker):
    started = time.time()
    if STREAM_URL:
        stream_call(marker)
    else:
        time.sleep(sleep_s)  # gevent's, in each of these workers
    _redis.rpush(DONE, '%.6f %.6f %.6f' % (enqueued_at, started, time.time()))


def stream_call(marker):
    """One streamed chat completion read to its end (the peers forward nothing: wall only)."""
    parts = urlsplit(STREAM_URL)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {'model': 'm', 'stream': True, 'messages': [{'role': 'user', 'content': marker}]}
    conn.request('POST', '/v1/chat/completions', json.dumps(body), {'Content-Type': 'json'})
    answer = conn.getresponse()
    while answer.readline():
        pass
    conn.close()


if PEER == 'dramatiq':
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    dramatiq.set_broker(RedisBroker(connection_pool=_pool))

    @dramatiq.actor(max_retries=0, time_limit=600_000)
    def job(enqueued_at, sleep_s, marker):
        run_job(enqueued_at, sleep_s, marker)

    def send(*args):
        job.send(*args)

elif PEER == 'celery':
    from celery import Celery

    app = Celery('long_calls_peers', broker=URL)
    app.conf.broker_transport_options = {'max_connections': CONNECTIONS}

    @app.task(name='long_calls.job')
    def job(enqueued_at, sleep_s, marker):
        run_job(enqueued_at, sleep_s, marker)

    def send(*args):
        job.delay(*args)

elif PEER == 'huey':
    from huey import RedisHuey

    huey = RedisHuey('long-calls', connection_pool=_pool)

    @huey.task()
    def job(enqueued_at, sleep_s, marker):
        run_job(enqueued_at, sleep_s, marker)

    def send(*args):
        job(*args)


def enqueue(jobs, sleep_s):
    """All ``jobs`` at once; FIRST is when the first was sent."""
    _redis.set(FIRST, '%.6f' % time.time())
    for n in range(jobs):
        send(time.time(), sleep_s, 'long-calls-job-%d' % n)
