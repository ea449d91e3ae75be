"""One webhook POST to an address checked just before (engine/features/webhooks/urls.py): the
connection goes to that address, while the Host header and TLS (SNI and certificate) use the
URL's name. Redirects are never followed: a 3xx is a failed attempt like any other non-2xx."""

import http.client
import socket
import ssl


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, target, timeout_s):
        super().__init__(target.host, target.port, timeout=timeout_s)
        self._address = target.address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, target, timeout_s):
        super().__init__(
            target.host, target.port, timeout=timeout_s, context=ssl.create_default_context()
        )
        self._address = target.address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(target, body, headers, timeout_s):
    """POST ``body`` to ``target``; returns the response status. Raises OSError (refused,
    timed out, TLS failure) or http.client.HTTPException (a broken answer). The response body
    is read (up to 64 KiB) and dropped: receivers are told nothing by it."""
    kind = _PinnedHTTPSConnection if target.scheme == 'https' else _PinnedHTTPConnection
    connection = kind(target, timeout_s)
    try:
        connection.request('POST', target.path, body=body, headers=headers)
        response = connection.getresponse()
        response.read(65536)
        return response.status
    finally:
        connection.close()
