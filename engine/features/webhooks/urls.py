"""Where a webhook may point (architecture decision 15): https only (plain http when
AIJOB_WEBHOOK_ALLOW_HTTP=1), and never to loopback, link-local, private or otherwise special
addresses (unless AIJOB_WEBHOOK_ALLOW_PRIVATE=1), so that a webhook cannot reach into the
operator's own network. The rule is applied when a URL is registered and again before every
delivery, to the addresses the name resolves to then: the sender connects to an address it has
just checked, so a name that re-resolves elsewhere (DNS rebinding) gains nothing."""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from ...core.errors import WebhookUrlRefusedError

MAX_URL_CHARS = 2048


@dataclass(frozen=True)
class UrlPolicy:
    allow_http: bool = False
    allow_private: bool = False


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (``address``, one the name resolved to) and what to ask
    for there (``host`` for the Host header and TLS, ``path``)."""

    scheme: str
    host: str
    port: int
    path: str
    address: str


def resolve(host, port):
    """The addresses ``host`` resolves to now (tests replace this one step)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


def is_public(address):
    """Is ``address`` a globally routable unicast address? (IPv4-mapped IPv6 judged as IPv4.)"""
    ip = ipaddress.ip_address(address.split('%')[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_syntax(url, policy, field='url'):
    """The parts of ``url`` if its form is acceptable (scheme, host, no credentials); raises
    WebhookUrlRefusedError naming ``field`` otherwise. Resolves nothing."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise WebhookUrlRefusedError(
            '%s must be a URL of at most %d characters' % (field, MAX_URL_CHARS), field=field
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookUrlRefusedError('%s is not a valid URL' % field, field=field) from None
    allowed = ('https', 'http') if policy.allow_http else ('https',)
    if parts.scheme not in allowed:
        raise WebhookUrlRefusedError('%s must use %s' % (field, ' or '.join(allowed)), field=field)
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise WebhookUrlRefusedError(
            '%s must name a host, without user or password' % field, field=field
        )
    default_port = 443 if parts.scheme == 'https' else 80
    path = (parts.path or '/') + ('?' + parts.query if parts.query else '')
    return parts.scheme, parts.hostname, port or default_port, path


def check_url(url, policy, field='url'):
    """A Target for ``url``: its form checked, its name resolved now and every address it
    resolves to allowed by ``policy``; WebhookUrlRefusedError naming ``field`` otherwise."""
    scheme, host, port, path = check_syntax(url, policy, field)
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        raise WebhookUrlRefusedError('%s: the host does not resolve' % field, field=field) from None
    if not addresses:
        raise WebhookUrlRefusedError('%s: the host does not resolve' % field, field=field)
    if not policy.allow_private:
        # Every address, not just the first: a name with one public and one private address
        # would otherwise reach the private one on some connections.
        for address in addresses:
            if not is_public(address):
                raise WebhookUrlRefusedError(
                    '%s resolves to a loopback, link-local or private address' % field,
                    field=field,
                )
    return Target(scheme, host, port, path, addresses[0])
