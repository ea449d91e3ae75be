"""AIJOB_REDIS_URL names a topology (issue 13 item 1): one server, a Redis Cluster or a
Sentinel-watched master; a bad URL is refused at start-up without echoing its password."""

import pytest

from engine.core.errors import ConfigError
from engine.core.redis_url import CLUSTER, SENTINEL, SINGLE, parse_redis_url
from engine.dispatch.memory_queue import MemoryQueue
from engine.dispatch.redis_queue import RedisQueue
from engine.extensions import load_config


@pytest.mark.parametrize(
    'url',
    [
        'redis://127.0.0.1:6379/0',
        'redis://cache',
        'rediss://:secret@cache.example:6380/2',
        'unix:///run/redis.sock',
    ],
)
def test_one_server_urls_go_to_the_driver_as_they_are(url):
    target = parse_redis_url(url)
    assert target.kind == SINGLE and target.url == url


def test_a_cluster_url_lists_its_seed_nodes():
    target = parse_redis_url('redis+cluster://user:p%40ss@10.0.0.1:7000,10.0.0.2:7001,[::1]')
    assert target.kind == CLUSTER
    assert target.nodes == (('10.0.0.1', 7000), ('10.0.0.2', 7001), ('::1', 6379))
    assert (target.username, target.password) == ('user', 'p@ss')
    assert parse_redis_url('redis+cluster://a:1/0').nodes == (('a', 1),)


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    target = parse_redis_url('redis+sentinel://:pw@s1:26379,s2/mymaster/3?sentinel_password=sp')
    assert target.kind == SENTINEL
    assert target.nodes == (('s1', 26379), ('s2', 26379))
    assert (target.service, target.db) == ('mymaster', 3)
    assert (target.username, target.password, target.sentinel_password) == (None, 'pw', 'sp')
    assert parse_redis_url('redis+sentinel://s1:5000/aijob').db == 0


def test_no_password_shows_in_a_target_or_its_description():
    url = 'redis+sentinel://:hunter2@s1:26379/mymaster?sentinel_password=hunter3'
    target = parse_redis_url(url)
    assert 'hunter' not in repr(target) and 'hunter' not in target.describe()
    single = parse_redis_url('redis://:hunter2@cache:6380/1')
    assert 'hunter' not in repr(single) and single.describe() == 'redis://cache:6380'
    assert parse_redis_url('unix:///run/redis.sock').describe() == 'unix:///run/redis.sock'
    cluster = parse_redis_url('redis+cluster://u:hunter2@a:7000,b:7001')
    assert cluster.describe() == 'cluster (a:7000,b:7001)'


@pytest.mark.parametrize(
    'url',
    [
        'http://cache',
        'cache:6379',
        'redis+cluster://a:1/3',  # a cluster has database 0 only
        'redis+cluster://a:1,:2',
        'redis+cluster://a:99999',
        'redis+sentinel://s1:26379',  # no service name
        'redis+sentinel://s1:26379/m/x',
        'redis+sentinel://s1:26379/m/1/2',
        'redis://cache:notaport',
        'redis://cache/zero',
    ],
)
def test_a_bad_url_is_refused_at_start_up_naming_the_variable(url):
    with pytest.raises(ConfigError) as caught:
        load_config({'AIJOB_REDIS_URL': url})
    assert 'AIJOB_REDIS_URL' in str(caught.value)


def test_a_refused_url_never_echoes_its_password():
    with pytest.raises(ConfigError) as caught:
        load_config({'AIJOB_REDIS_URL': 'redis+sentinel://:hunter2@s1:26379'})
    assert 'hunter2' not in str(caught.value)


@pytest.mark.parametrize(
    'url',
    [
        'redis+cluster://127.0.0.1:7000,127.0.0.1:7001',
        'redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/aijob/1',
    ],
)
def test_the_configuration_accepts_every_topology(url):
    assert load_config({'AIJOB_REDIS_URL': url}).redis_url == url


def test_a_queue_on_an_unreachable_cluster_is_built_and_fails_only_when_used():
    """The client is built at first use: a worker starts while its cluster is down, and every
    call fails QueueUnavailableError (never a driver exception) until a node answers."""
    from engine.core.errors import QueueUnavailableError

    queue = RedisQueue('redis+cluster://127.0.0.1:1', prefix='nowhere', shards=4)
    with pytest.raises(QueueUnavailableError):
        queue.check_ready()
    with pytest.raises(QueueUnavailableError):
        queue.heartbeat('c1', 1000)
    queue.close()


def test_the_in_memory_queue_is_ready_when_it_answers():
    MemoryQueue().check_ready()
