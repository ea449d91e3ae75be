"""AIJOB_REDIS_URL: which Redis topology the queues live on (issue 13 item 1).

Parsed here, without the driver, so the configuration refuses a bad URL at start-up and the
dispatch layer builds its client from a plain description:

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS), ``unix://path``: one
  server;
- ``redis+cluster://[[user]:password@]host:port[,host:port…]``: a Redis Cluster, any of its nodes
  as seeds (a cluster has only database 0);
- ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]``: the master
  that the sentinels name for ``service_name``; the password is the data nodes' (the sentinels'
  own, if they have one, is ``?sentinel_password=``).
"""

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

SINGLE, CLUSTER, SENTINEL = 'single', 'cluster', 'sentinel'
_MULTI = {'redis+cluster': CLUSTER, 'redis+sentinel': SENTINEL}
DEFAULT_PORTS = {CLUSTER: 6379, SENTINEL: 26379}


@dataclass(frozen=True)
class RedisTarget:
    kind: str  # SINGLE, CLUSTER or SENTINEL
    url: str = field(repr=False)  # as given (a SINGLE one goes to from_url as is)
    nodes: tuple = ()  # ((host, port), …): cluster seeds or sentinels
    service: str = ''  # the sentinels' name of the master
    db: int = 0
    username: str = None
    password: str = field(default=None, repr=False)
    sentinel_password: str = field(default=None, repr=False)

    def describe(self):
        """The topology without any credential, for logs and the start-up banner."""
        if self.kind == SINGLE:
            parts = urlsplit(self.url)
            if parts.scheme == 'unix':
                return 'unix://%s' % parts.path
            return '%s://%s%s' % (parts.scheme, parts.hostname or '', _port(parts))
        nodes = ','.join('%s:%d' % node for node in self.nodes)
        return '%s (%s%s)' % (self.kind, nodes, '/' + self.service if self.service else '')


def _port(parts):
    try:
        return ':%d' % parts.port if parts.port else ''
    except ValueError:
        return ''


def parse_redis_url(url):
    """The RedisTarget of ``url``; ValueError (never echoing a password) if it is not one."""
    scheme, sep, rest = url.partition('://')
    if not sep:
        raise ValueError('not a URL')
    scheme = scheme.lower()
    if scheme in ('redis', 'rediss', 'unix'):
        return _single(url)
    if scheme not in _MULTI:
        raise ValueError('unknown scheme %r' % scheme)
    kind = _MULTI[scheme]
    rest, _, query = rest.partition('?')
    netloc, _, path = rest.partition('/')
    userinfo, at, hosts = netloc.rpartition('@')
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(':')
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_node(text, DEFAULT_PORTS[kind]) for text in hosts.split(','))
    options = parse_qs(query)
    segments = [unquote(s) for s in path.split('/') if s]
    if kind == CLUSTER:
        if segments not in ([], ['0']):
            raise ValueError('a Redis Cluster has only database 0')
        return RedisTarget(kind, url, nodes, username=username, password=password)
    if not segments or len(segments) > 2:
        raise ValueError('expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]')
    return RedisTarget(
        kind,
        url,
        nodes,
        service=segments[0],
        db=_db(segments[1]) if len(segments) == 2 else 0,
        username=username,
        password=password,
        sentinel_password=(options.get('sentinel_password') or [None])[0],
    )


def _single(url):
    parts = urlsplit(url)
    if not (parts.hostname or parts.path):
        raise ValueError('no host')
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError('bad port')
    if parts.scheme != 'unix' and parts.path.strip('/'):
        _db(parts.path.strip('/'))
    return RedisTarget(SINGLE, url)


def _node(text, default_port):
    text = text.strip()
    if text.startswith('['):  # an IPv6 address: [::1] or [::1]:7000
        host, _, rest = text[1:].partition(']')
        port = rest[1:] if rest.startswith(':') else (rest or str(default_port))
    else:
        host, colon, port = text.rpartition(':')
        if not colon:
            host, port = port, str(default_port)
    if not host:
        raise ValueError('a node without a host')
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError('bad port %r' % port)
    return host, int(port)


def _db(text):
    if not text.isdigit():
        raise ValueError('database %r is not a number' % text)
    return int(text)
