"""The chat call's own HTTP/1.1 transport (engine/features/gateway/http_stream.py), against a
loopback server that answers each request with the bytes a test scripts: every body framing,
kept connections, and the ways a server breaks the protocol."""

import datetime
import gzip
import ipaddress
import socket
import ssl

import pytest

from engine.features.gateway import http_stream
from tests.support.scripted_http import ScriptedServer


@pytest.fixture
def serve():
    made = []

    def start(*answers, close_after=False, hold=False):
        made.append(ScriptedServer(answers, close_after, hold))
        return made[-1]

    yield start
    for server in made:
        server.close()


def post(server, read_timeout_s=2.0, endpoint=None):
    endpoint = endpoint or http_stream.Endpoint(server.url, ssl_context=None)
    return endpoint.post({'Authorization': 'Bearer k'}, b'{"a": 1}', 2.0, read_timeout_s)


def body_of(response):
    try:
        return b''.join(response.iter_bytes())
    finally:
        response.close()


CHUNKED = (
    b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\n\r\n'
)


def test_the_request_is_sent_whole_and_each_framing_of_the_body_is_read(serve):
    server = serve(
        CHUNKED,
        b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello',
        b'HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nX-A: 1\r\nX-A: 2\r\n'
        b'Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s'
        % (len(gzip.compress(b'zipped')), gzip.compress(b'zipped')),
        b'HTTP/1.0 200 OK\r\n\r\nuntil the server closes',
    )
    endpoint = http_stream.Endpoint(server.url, ssl_context=None)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    assert body_of(post(server, endpoint=endpoint)) == b'hello'
    third = post(server, endpoint=endpoint)
    assert (third.status_code, third.headers['x-a']) == (200, '1, 2')  # after the interim one
    assert body_of(third) == b'zipped'
    assert body_of(post(server, endpoint=endpoint)) == b'until the server closes'
    head, body = server.requests[0]
    assert head.startswith(b'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:')
    assert b'Authorization: Bearer k\r\n' in head and body == b'{"a": 1}'
    assert server.connections == 1  # kept alive through the first three answers


@pytest.mark.parametrize('seen_before_use', [True, False])
def test_a_kept_connection_the_server_closed_meanwhile_is_replaced(
    serve, monkeypatch, seen_before_use
):
    """Seen closed when taken (readable: its end of file), or, when the server closes it just
    as it is taken (here: the check made blind), failing before a byte of the answer came:
    either way the request goes out once more, on a new connection."""
    server = serve(CHUNKED, CHUNKED, close_after=True)
    endpoint = http_stream.Endpoint(server.url, ssl_context=None)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    if not seen_before_use:
        monkeypatch.setattr(http_stream, '_readable', lambda sock: False)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    assert server.connections == 2
    assert len(server.requests) == 2  # the request went out whole once per answer


def test_an_error_answer_is_read_whole_with_its_headers(serve):
    server = serve(
        b'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 12\r\n\r\n'
        b'{"error": 1}'
    )
    response = post(server)
    assert not response.is_success
    assert response.read() == b'{"error": 1}' and response.text == '{"error": 1}'
    assert response.headers['retry-after'] == '7'
    response.close()


@pytest.mark.parametrize(
    'answer',
    [
        b'HTTP/1.1 banana\r\n\r\n',  # no status
        b'HTTP/1.1 200 OK\r\nno colon here\r\n\r\n',
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',  # no chunk size
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX',  # no line end
        b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf',  # closed mid-body
        b'HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx',
        b'HTTP/1.1 \xc2\xb200 OK\r\n\r\n',  # a superscript two is a digit to str.isdigit
    ],
)
def test_a_server_that_breaks_the_protocol_is_a_transport_error(serve, answer):
    server = serve(answer, close_after=True)
    with pytest.raises(http_stream.TransportError):
        body_of(post(server))


def test_a_silent_server_times_out_and_a_closed_port_is_a_transport_error(serve):
    silent = serve(
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n', hold=True
    )
    response = post(silent, read_timeout_s=0.2)
    with pytest.raises(http_stream.Timeout):
        body_of(response)
    closed = socket.create_server(('127.0.0.1', 0))
    port = closed.getsockname()[1]
    closed.close()
    endpoint = http_stream.Endpoint('http://127.0.0.1:%d/v1' % port, ssl_context=None)
    with pytest.raises(http_stream.TransportError) as caught:
        endpoint.post({}, b'', 1.0, 1.0)
    assert not isinstance(caught.value, http_stream.Timeout)
    assert str(caught.value) == 'ConnectionRefusedError'  # no address in the message


def test_a_proxy_from_the_environment_applies_as_httpx_reads_it(monkeypatch):
    for name in ('HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY', 'NO_PROXY'):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert not http_stream.proxy_applies('https://api.example.com/v1')
    monkeypatch.setenv('HTTPS_PROXY', 'http://proxy.internal:3128')
    assert http_stream.proxy_applies('https://api.example.com/v1')
    assert not http_stream.proxy_applies('http://10.0.0.5:8000/v1')  # no proxy for http
    monkeypatch.setenv('ALL_PROXY', 'http://proxy.internal:3128')
    monkeypatch.setenv('NO_PROXY', '10.0.0.5,localhost')
    assert not http_stream.proxy_applies('http://10.0.0.5:8000/v1')
    assert http_stream.proxy_applies('http://10.0.0.6:8000/v1')


def self_signed(folder):
    """A certificate for localhost and 127.0.0.1 and its key, as files in ``folder``."""
    from cryptography import x509  # noqa: PLC0415 - only this test makes certificates
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'localhost')])
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName('localhost'), x509.IPAddress(ipaddress.ip_address('127.0.0.1'))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / 'cert.pem', folder / 'key.pem'
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def test_https_verifies_the_servers_certificate_and_keeps_the_connection(tmp_path):
    cert, key = self_signed(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    server = ScriptedServer([CHUNKED, CHUNKED, CHUNKED], tls=server_side)
    try:
        trusting = ssl.create_default_context(cafile=cert)
        endpoint = http_stream.Endpoint(server.url, ssl_context=trusting)
        assert body_of(post(server, endpoint=endpoint)) == b'hello!'
        assert body_of(post(server, endpoint=endpoint)) == b'hello!'
        assert server.connections == 1
        # A certificate the context does not trust: refused, as httpx refuses it.
        stranger = http_stream.Endpoint(server.url, ssl_context=ssl.create_default_context())
        with pytest.raises(http_stream.TransportError) as caught:
            stranger.post({}, b'', 2.0, 2.0)
        assert str(caught.value) == 'SSLCertVerificationError'
    finally:
        server.close()


def test_a_header_with_a_line_break_or_beyond_latin_1_is_refused_before_anything_is_sent(serve):
    server = serve(CHUNKED)
    endpoint = http_stream.Endpoint(server.url, ssl_context=None)
    for key in ('sk-key\n', 'sk-key\r\nX-Injected: 1', 'sk-\u200bkey'):
        with pytest.raises(http_stream.TransportError) as caught:
            endpoint.post({'Authorization': 'Bearer ' + key}, b'{}', 2.0, 2.0)
        assert str(caught.value) == 'an invalid header value'  # the key is not quoted
    assert server.connections == 0


def test_a_hung_up_answer_read_to_its_end_never_goes_back_to_the_kept_connections(serve):
    server = serve(CHUNKED, CHUNKED)
    endpoint = http_stream.Endpoint(server.url, ssl_context=None)
    response = post(server, endpoint=endpoint)
    assert b''.join(response.iter_bytes()) == b'hello!'
    response.hang_up()  # the watcher, as the body's last bytes were read
    response.close()
    assert endpoint._idle == []  # not kept (a kept one would only be refused when taken)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    assert server.connections == 2


def test_a_kept_connection_idle_past_its_expiry_is_not_used(serve, monkeypatch):
    server = serve(CHUNKED, CHUNKED)
    endpoint = http_stream.Endpoint(server.url, ssl_context=None)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    monkeypatch.setattr(http_stream, 'IDLE_EXPIRY_S', 0.0)
    assert body_of(post(server, endpoint=endpoint)) == b'hello!'
    assert server.connections == 2
