"""One streamed POST over HTTP/1.1 on the process's sockets (gevent's, in a worker): the chat
call's transport when no proxy applies (openai_client._open; a proxy, from the environment as
httpx reads it, sends the call through httpx instead). It sends the request, reads the answer's
head, then gives the body's bytes as they arrive, whatever its framing (chunked, a length, or
until the server closes); a body read to its end leaves a keep-alive connection for the
provider's next call.

*Why not httpx for every call:* httpx, httpcore and h11 read each chunk through layers of
generators, context managers and timeouts. 1 000 loopback streams of 100 chunks each, opened and
read whole on gevent, cost 5.4 s of CPU through httpx and 2.3-2.6 s on the socket directly
(54 against 24 µs per chunk, issue 34): with thousands of streams at once, the worker's core.

Failures are this module's two exceptions: ``Timeout`` (connect or read) and
``TransportError`` (the connection failed or closed early, or the server broke the protocol).
"""

import re
import select
import socket
import threading
import time
import urllib.request
import zlib
from urllib.parse import urlsplit

HEAD_LIMIT = 64 * 1024  # an answer's head longer than this is no HTTP server's
READ_SIZE = 64 * 1024
IDLE_KEPT = 64  # idle keep-alive connections an endpoint keeps for its next calls...
IDLE_EXPIRY_S = 5.0  # ...for this long (httpx's keep-alive expiry)
_BREAKS = re.compile(r'[\r\n\0]')
EVENT_LIMIT = 4 * 1024 * 1024  # a chunk-size line or an event longer than this: a broken body


class TransportError(Exception):
    """The connection failed or closed early, or the server broke HTTP/1.1."""


class Timeout(TransportError):
    """Connecting or reading took longer than its timeout."""


def proxy_applies(url):
    """Whether the environment's proxy settings (``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``
    and their lowercase forms, as httpx reads them) send requests to ``url`` through a proxy."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get('all')
    return bool(proxy) and not urllib.request.proxy_bypass_environment(parts.hostname, proxies)


class Endpoint:
    """Where one provider's streamed POSTs go (``url``: http or https), with its idle
    keep-alive connections."""

    def __init__(self, url, ssl_context):
        parts = urlsplit(url)
        if parts.scheme not in ('http', 'https'):
            raise ValueError('not an http or https URL')
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == 'https' else 80)
        self._tls = ssl_context if parts.scheme == 'https' else None
        target = (parts.path or '/') + ('?' + parts.query if parts.query else '')
        host = parts.netloc.rsplit('@', 1)[-1]
        self._start = ('POST %s HTTP/1.1\r\nHost: %s\r\n' % (target, host)).encode('ascii')
        self._idle = []
        self._lock = threading.Lock()

    def post(self, headers, body, connect_timeout_s, read_timeout_s):
        """The Response to POSTing ``body`` (bytes) with ``headers`` ({name: value}), its head
        read. A kept connection that fails before a byte of the answer came (the server
        closed it as it was taken) is replaced by a new one, once."""
        request = self._request(headers, body)
        sock = self._take_idle()
        while True:
            reused = sock is not None
            if not reused:
                sock = self._connect(connect_timeout_s)
            response = Response(self, sock, read_timeout_s)
            try:
                sock.sendall(request)
                response.read_head()
                return response
            except socket.timeout:
                response.close()
                raise Timeout('no answer within %.1f s' % read_timeout_s) from None
            except (OSError, TransportError) as exc:
                response.close()
                if reused and not response.heard:
                    sock = None  # a new connection, never another kept one
                    continue
                raise TransportError(_reason(exc)) from None

    def _request(self, headers, body):
        # A line break or NUL in a header (a key pasted with its newline) would end the head
        # early and send the rest, the job's input, as another request: refused, as httpx
        # refuses it, without quoting the value (it may be a key).
        if any(_BREAKS.search(name) or _BREAKS.search(value) for name, value in headers.items()):
            raise TransportError('an invalid header value')
        lines = ''.join('%s: %s\r\n' % item for item in headers.items())
        lines += 'Content-Length: %d\r\n\r\n' % len(body)
        try:
            return self._start + lines.encode('latin-1') + body
        except UnicodeEncodeError:
            raise TransportError('an invalid header value') from None

    def _connect(self, timeout_s):
        sock = None
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            return sock
        except socket.timeout:
            _close(sock)
            raise Timeout('no connection within %.1f s' % timeout_s) from None
        except (OSError, ValueError) as exc:  # ValueError: a host IDNA cannot encode
            _close(sock)
            raise TransportError(_reason(exc)) from None

    def _take_idle(self):
        """A kept connection still fit for a request: idle for less than IDLE_EXPIRY_S, and
        with nothing to read (a server that closed it, or wrote to it unasked, makes it
        readable); the others are closed."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock, since = self._idle.pop()
            if now - since < IDLE_EXPIRY_S and not _readable(sock):
                return sock
            _close(sock)

    def give_back(self, sock):
        with self._lock:
            if len(self._idle) < IDLE_KEPT:
                self._idle.append((sock, time.monotonic()))
                return
        _close(sock)


class Response:
    """An answer: ``status_code``, ``headers`` (lowercase names), then its body, read once:
    ``iter_bytes`` (as they arrive, decoded) or ``read`` (whole, into ``content``)."""

    def __init__(self, endpoint, sock, read_timeout_s):
        self.endpoint = endpoint
        self.sock = sock  # the stream watcher hangs it up (openai_client._hang_up)
        self.read_timeout_s = read_timeout_s
        self.status_code = 0
        self.headers = {}
        self.heard = False  # whether any byte of the answer arrived
        self.content = b''
        self._rest = b''  # bytes read past the head
        self._done = False  # the body was read to its end
        self._keep_alive = False
        self._hung_up = False

    @property
    def is_success(self):
        return 200 <= self.status_code < 300

    @property
    def text(self):
        return self.content.decode('utf-8', 'replace')

    def read_head(self):
        self.sock.settimeout(self.read_timeout_s)
        buffer = b''
        while True:
            while b'\r\n\r\n' not in buffer:
                if len(buffer) > HEAD_LIMIT:
                    raise TransportError('an answer head over %d bytes' % HEAD_LIMIT)
                data = self.sock.recv(READ_SIZE)
                if not data:
                    raise TransportError('the server closed the connection before answering')
                self.heard = True
                buffer += data
            head, _, buffer = buffer.partition(b'\r\n\r\n')
            version, status, fields = _parse_head(head)
            if not 100 <= status < 200:  # an interim answer (103 Early Hints) comes before
                break
        self.status_code, self.headers, self._rest = status, fields, buffer
        connection = fields.get('connection', '').lower()
        self._keep_alive = version == 'HTTP/1.1' and 'close' not in connection

    def _raw_body(self):
        try:
            if 'chunked' in self.headers.get('transfer-encoding', '').lower():
                yield from self._chunked()
            elif 'content-length' in self.headers:
                yield from self._sized(_length(self.headers['content-length']))
            else:
                self._keep_alive = False
                yield from self._until_close()
        except socket.timeout:
            raise Timeout('no data within %.1f s' % self.read_timeout_s) from None
        except OSError as exc:
            raise TransportError(_reason(exc)) from None

    def iter_bytes(self):
        encoding = self.headers.get('content-encoding', 'identity').lower()
        if encoding == 'identity':
            yield from self._raw_body()
            return
        if encoding not in ('gzip', 'deflate'):
            raise TransportError('an unsupported content-encoding')
        decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by the header
        try:
            for piece in self._raw_body():
                yield decoder.decompress(piece)
            yield decoder.flush()
        except zlib.error:
            raise TransportError('a body that does not decompress') from None

    def read(self):
        self.content = b''.join(self.iter_bytes())
        return self.content

    def hang_up(self):
        """From another greenlet (the stream watcher): wake a read blocked on a silent server.
        The socket itself is shut down, under any TLS layer (whose own shutdown would unwrap
        it), and it never goes back to the kept connections."""
        self._hung_up = True
        sock = self.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the other side

    def close(self):
        if self.sock is None:
            return
        sock, self.sock = self.sock, None
        if self._done and self._keep_alive and not self._hung_up:
            self.endpoint.give_back(sock)
        else:
            _close(sock)

    def _recv(self):
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise TransportError('the server closed the connection mid-answer')
        return data

    def _chunked(self):
        buffer, self._rest = self._rest, b''
        while True:
            while b'\r\n' not in buffer:
                if len(buffer) > EVENT_LIMIT:
                    raise TransportError('a chunk size line over %d bytes' % EVENT_LIMIT)
                buffer += self._recv()
            size_line, _, buffer = buffer.partition(b'\r\n')
            size = _length(size_line.split(b';', 1)[0], base=16)
            if size == 0:
                break
            while size:  # a chunk's bytes as they arrive: a stream's events are not held back
                if not buffer:
                    buffer = self._recv()
                piece, buffer = buffer[:size], buffer[size:]
                size -= len(piece)
                yield piece
            while len(buffer) < 2:
                buffer += self._recv()
            if buffer[:2] != b'\r\n':
                raise TransportError('a chunk without its line end')
            buffer = buffer[2:]
        # Trailers, if any, end with an empty line: the body's end.
        while not (buffer.startswith(b'\r\n') or b'\r\n\r\n' in buffer):
            if len(buffer) > HEAD_LIMIT:
                raise TransportError('trailers over %d bytes' % HEAD_LIMIT)
            buffer += self._recv()
        self._done = True

    def _sized(self, length):
        piece, self._rest = self._rest[:length], b''
        left = length - len(piece)
        if piece:
            yield piece
        while left:
            piece = self._recv()[:left]
            left -= len(piece)
            yield piece
        self._done = True

    def _until_close(self):
        if self._rest:
            yield self._rest
        while True:
            data = self.sock.recv(READ_SIZE)
            if not data:
                self._done = True
                return
            yield data


def _parse_head(head):
    """(version, status, {lowercase name: value}) of an answer's head."""
    lines = head.decode('latin-1').split('\r\n')
    parts = lines[0].split(' ', 2)
    if len(parts) < 2 or not parts[0].startswith('HTTP/') or not _is_status(parts[1]):
        raise TransportError('a malformed status line')
    fields = {}
    for line in lines[1:]:
        name, colon, value = line.partition(':')
        if not colon:
            raise TransportError('a malformed header line')
        name, value = name.strip().lower(), value.strip()
        fields[name] = fields[name] + ', ' + value if name in fields else value
    return parts[0], int(parts[1]), fields


def _is_status(text):
    return len(text) == 3 and text.isascii() and text.isdigit()


def _readable(sock):
    """Whether an idle socket has something to read: an end of file, or bytes nobody asked for."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _length(text, base=10):
    try:
        value = int(text.strip(), base)
    except ValueError:
        raise TransportError('a malformed length') from None
    if value < 0:
        raise TransportError('a malformed length')
    return value


def _reason(exc):
    """What failed, without the exception's message (it may quote an address)."""
    return exc.args[0] if isinstance(exc, TransportError) else exc.__class__.__name__


def _close(sock):
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass
