"""The DNS resolver of the processes that run on gevent (``serve``, ``web``, ``worker``):
gevent's default one, which runs each lookup on the hub's pool of native threads, with two
shortcuts. ``install`` makes it the hub's (before the hub's first lookup).

- **A numeric host is answered in place.** A provider at an IP address (a loopback or
  in-cluster server, as local models usually are) needs no DNS: ``getaddrinfo`` with
  AI_NUMERICHOST never leaves the process, so it costs no thread.
- **Lookups of one name at once share one.** The first asks the thread pool; the others wait
  for its answer. Nothing is kept after it: the next lookup asks again, so DNS changes are seen
  as before (and the system's own cache, if any, still applies).

*Why:* the pool has 10 threads, and a worker opening 2 000 provider calls at once queued 2 000
lookups of the same host on them. A call waited for its connection until earlier calls ended
(a median of 12 s after its job started, issue 34), and handing each lookup to a thread and
back cost a twentieth of the worker's CPU.
"""

import _socket  # the C module: gevent patches ``socket``, whose lookups come back here

from gevent.event import AsyncResult
from gevent.resolver.thread import Resolver as ThreadResolver

_AGAIN = object()  # the lookup a caller waited on was killed: ask again


def install():
    """Make ``Resolver`` the resolver of every gevent hub made from now on (the main thread's
    hub is made at its first use, after the patching)."""
    import gevent  # noqa: PLC0415 - only the gevent commands call this

    gevent.config.resolver = Resolver


class Resolver(ThreadResolver):
    def __init__(self, hub=None):
        super().__init__(hub)
        self._asking = {}  # the arguments of a lookup in flight: AsyncResult of its answer

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        if is_numeric(host):
            return _socket.getaddrinfo(
                host, port, family, type, proto, flags | _socket.AI_NUMERICHOST
            )
        key = (host, port, family, type, proto, flags)
        while key in self._asking:
            answer = self._asking[key].get()  # raises the lookup's error, as it would have
            if answer is not _AGAIN:
                return list(answer)
        return self._ask(key)

    def _ask(self, key):
        answer = self._asking[key] = AsyncResult()
        try:
            found = super().getaddrinfo(*key)
        except Exception as exc:
            answer.set_exception(exc)
            raise
        except BaseException:  # this greenlet was killed: the others must not die of it
            answer.set(_AGAIN)
            raise
        else:
            answer.set(found)
        finally:
            del self._asking[key]
        return list(found)


def is_numeric(host):
    """Whether ``host`` (str, bytes or None) is an IPv4 or IPv6 address."""
    if host is None:
        return False
    if isinstance(host, bytes):
        host = host.decode('ascii', 'replace')
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host.split('%', 1)[0])  # fe80::1%eth0: its zone aside
        except (OSError, ValueError):
            continue
        return True
    return False
