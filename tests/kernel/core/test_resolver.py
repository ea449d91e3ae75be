"""The gevent processes' DNS resolver (engine/core/resolver.py): a numeric host never reaches
the thread pool, and lookups of one name at once share one."""

import socket

import gevent
import pytest
from gevent.resolver.thread import Resolver as ThreadResolver

from engine.core import resolver


class PoolLookups:
    """Stands in for the thread pool's lookup: counts the lookups, each taking a while."""

    def __init__(self, answer=None, error=None):
        self.asked = []
        self.answer = answer or [(socket.AF_INET, socket.SOCK_STREAM, 6, '', ('192.0.2.7', 443))]
        self.error = error

    def __call__(self, *args):  # a class attribute that is no function: no self passed
        self.asked.append(args)
        gevent.sleep(0.05)
        if self.error is not None:
            raise self.error
        return self.answer


@pytest.fixture
def pool(monkeypatch):
    lookups = PoolLookups()
    monkeypatch.setattr(ThreadResolver, 'getaddrinfo', lookups)
    return lookups


def test_a_numeric_host_is_answered_without_the_thread_pool(pool):
    dns = resolver.Resolver(gevent.get_hub())
    for host in ('127.0.0.1', b'10.1.2.3', '::1'):
        (first, *_) = dns.getaddrinfo(host, 8300, 0, socket.SOCK_STREAM)
        assert first[4][:2] == (host.decode() if isinstance(host, bytes) else host, 8300)
    assert pool.asked == []
    assert resolver.is_numeric('fe80::1%eth0')
    assert not resolver.is_numeric('api.openai.com')
    assert not resolver.is_numeric(None)


def test_lookups_of_one_name_at_once_share_one_and_the_next_asks_again(pool):
    dns = resolver.Resolver(gevent.get_hub())
    askers = [gevent.spawn(dns.getaddrinfo, 'provider.example', 443) for _ in range(50)]
    askers.append(gevent.spawn(dns.getaddrinfo, 'other.example', 443))
    gevent.joinall(askers, raise_error=True)
    assert sorted(args[0] for args in pool.asked) == ['other.example', 'provider.example']
    assert all(a.value == pool.answer for a in askers)
    assert askers[0].value is not askers[1].value  # each caller gets a list of its own
    dns.getaddrinfo('provider.example', 443)  # nothing is kept: a later lookup asks again
    assert len(pool.asked) == 3


def test_a_failed_lookup_fails_every_caller_that_waited_for_it(monkeypatch):
    failing = PoolLookups(error=socket.gaierror(socket.EAI_NONAME, 'Name or service not known'))
    monkeypatch.setattr(ThreadResolver, 'getaddrinfo', failing)
    dns = resolver.Resolver(gevent.get_hub())
    askers = [gevent.spawn(dns.getaddrinfo, 'nowhere.invalid', 443) for _ in range(5)]
    gevent.joinall(askers)
    assert len(failing.asked) == 1
    assert all(isinstance(a.exception, socket.gaierror) for a in askers)


def test_when_the_asking_caller_is_killed_a_waiting_one_asks_again(pool):
    dns = resolver.Resolver(gevent.get_hub())
    first = gevent.spawn(dns.getaddrinfo, 'provider.example', 443)
    second = gevent.spawn(dns.getaddrinfo, 'provider.example', 443)
    gevent.sleep(0.01)  # both are waiting now: the first on the pool, the second on the first
    first.kill()
    assert second.get(timeout=5) == pool.answer
    assert len(pool.asked) == 2
