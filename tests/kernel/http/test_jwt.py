"""The application's JSON Web Tokens (issue 33, item 2), on both backend pairs: HS256 with a
shared secret; RS256 and ES256 from a JWKS served on loopback, including a key rotation (a new
kid fetched once); every refusal is 401 UNAUTHORIZED naming the failed check and no key (expired,
not yet valid, wrong aud or iss, alg none, an RS public key used as an HS secret, an unknown
kid, no sub); a JWT is never more than a user; without AIJOB_JWT_* nothing changes; start-up
refuses settings that contradict each other."""

import base64
import hashlib
import hmac
import http.server
import json
import threading
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from engine.core.errors import ConfigError
from engine.extensions import load_config
from tests.support.api import JOBS, Harness, job_body

SECRET = 'an-application-secret-of-32-bytes-or-more'
ISSUER = 'https://login.example.com'
AUDIENCE = 'aijob'


def claims(sub='user-a', **changes):
    now = int(time.time())
    body = {'sub': sub, 'iss': ISSUER, 'aud': AUDIENCE, 'iat': now, 'exp': now + 300}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b'=').decode('ascii')


def handmade(header, body, sign):
    """A token PyJWT would not make: ``sign(signing_input) -> bytes``."""
    signing_input = b64(json.dumps(header).encode()) + '.' + b64(json.dumps(body).encode())
    return signing_input + '.' + b64(sign(signing_input.encode()))


class KeyServer:
    """A JWKS on loopback whose keys a test changes; counts its fetches."""

    def __init__(self):
        self.keys = []
        self.fetches = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.fetches += 1
                data = json.dumps({'keys': server.keys}).encode()
                self.send_response(200)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = 'http://127.0.0.1:%d/.well-known/jwks.json' % self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def publish(self, *keys):
        self.keys = [key.jwk for key in keys]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class SigningKey:
    def __init__(self, kid, kind='RS256'):
        self.kid, self.algorithm = kid, kind
        if kind == 'RS256':
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwk = dict(jwk, kid=kid, use='sig', alg=kind)
        self.public_pem = self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, body, **header):
        return jwt.encode(
            body, self.private, algorithm=self.algorithm, headers=dict({'kid': self.kid}, **header)
        )


@pytest.fixture
def key_server():
    server = KeyServer()
    yield server
    server.close()


@pytest.fixture
def hs_api(make_runtime):
    rt = make_runtime(AIJOB_JWT_SECRET=SECRET, AIJOB_JWT_ISSUER=ISSUER, AIJOB_JWT_AUDIENCE=AUDIENCE)
    with rt.store.connection():
        yield Harness(rt)


@pytest.fixture
def jwks_api(make_runtime, key_server):
    rt = make_runtime(
        AIJOB_JWT_JWKS_URL=key_server.url, AIJOB_JWT_ISSUER=ISSUER, AIJOB_JWT_AUDIENCE=AUDIENCE
    )
    with rt.store.connection():
        yield Harness(rt)


def refused(harness, token, check):
    response = harness.client(token).get(JOBS)
    assert response.status == 401 and response.error_code == 'UNAUTHORIZED', response
    message = response.json['error']['message']
    assert check in message, message
    assert SECRET not in message and 'BEGIN' not in message
    return message


# ---------------------------------------------------------------- HS256
def test_an_hs256_jwt_is_its_subject_with_the_user_role(hs_api):
    token = jwt.encode(claims(role='SUPER_ADMIN'), SECRET, algorithm='HS256')
    user = hs_api.client(token)
    created = user.post(JOBS, job_body())
    assert created.status == 201
    # The same user as user-a's API token: the jobs are one user's.
    assert hs_api.a.get(JOBS + '/' + created.json['jobId']).status == 200
    assert hs_api.b.get(JOBS + '/' + created.json['jobId']).status == 404
    # A role claim gives nothing: no admin endpoint, no userId.
    assert user.get('/admin-api/ai/jobs').status == 403
    assert user.post(JOBS, job_body(userId='user-b')).status == 400


@pytest.mark.parametrize(
    'changes, check',
    [
        ({'exp': int(time.time()) - 3600}, 'expired (exp)'),
        ({'nbf': int(time.time()) + 3600}, 'not valid yet (nbf)'),
        ({'aud': 'another-app'}, 'audience (aud)'),
        ({'iss': 'https://evil.example.com'}, 'issuer (iss)'),
        ({'exp': None}, 'no exp claim'),
        ({'sub': None}, 'no sub claim'),
        ({'aud': None}, 'no aud claim'),
        ({'sub': 'has spaces'}, 'not a user id'),
    ],
)
def test_a_jwt_failing_a_check_is_401_naming_it(hs_api, changes, check):
    refused(hs_api, jwt.encode(claims(**changes), SECRET, algorithm='HS256'), check)


def test_a_forged_or_unsigned_jwt_is_401(hs_api):
    refused(hs_api, jwt.encode(claims(), 'another-secret-of-32-bytes-or-more!', 'HS256'), 'signat')
    none = handmade({'alg': 'none', 'typ': 'JWT'}, claims(), lambda data: b'')
    refused(hs_api, none, '(alg)')
    # The leeway (30 s) admits a token that expired a moment ago, not one an hour ago.
    recent = jwt.encode(claims(exp=int(time.time()) - 5), SECRET, algorithm='HS256')
    assert hs_api.client(recent).get(JOBS).status == 200
    garbage = refused(hs_api, 'a.b.c', 'malformed')
    assert garbage


# ---------------------------------------------------------------- a JWKS
def test_rs256_and_es256_from_a_jwks_with_a_key_rotation(jwks_api, key_server):
    old, ec_key = SigningKey('2026-01'), SigningKey('ec-1', 'ES256')
    key_server.publish(old, ec_key)
    assert jwks_api.client(old.sign(claims())).post(JOBS, job_body()).status == 201
    assert jwks_api.client(ec_key.sign(claims(sub='user-b'))).get(JOBS).status == 200
    assert key_server.fetches == 1  # cached
    # Rotation: the application signs with a new key it has just published.
    new = SigningKey('2026-02')
    key_server.publish(new)
    assert jwks_api.client(new.sign(claims())).get(JOBS).status == 200
    assert key_server.fetches == 2  # the unknown kid fetched the set once more
    # The retired key is gone from the set it now holds.
    refused(jwks_api, old.sign(claims()), 'no known signing key (kid)')


def test_an_rs_public_key_used_as_an_hs_secret_is_401(jwks_api, key_server):
    key = SigningKey('k1')
    key_server.publish(key)

    def with_public_key(data):
        return hmac.new(key.public_pem, data, hashlib.sha256).digest()

    confused = handmade({'alg': 'HS256', 'kid': 'k1'}, claims(), with_public_key)
    refused(jwks_api, confused, '(alg)')
    none = handmade({'alg': 'none', 'kid': 'k1'}, claims(), lambda data: b'')
    refused(jwks_api, none, '(alg)')
    stranger = SigningKey('k1')  # the right kid, another key
    refused(jwks_api, stranger.sign(claims()), 'signature')


def test_a_jwks_file_serves_as_well(make_runtime, tmp_path):
    key = SigningKey('file-1', 'ES256')
    path = tmp_path / 'jwks.json'
    path.write_text(json.dumps({'keys': [key.jwk]}))
    rt = make_runtime(AIJOB_JWT_JWKS_FILE=str(path))
    with rt.store.connection():
        harness = Harness(rt)
        assert harness.client(key.sign(claims(iss=None, aud=None))).get(JOBS).status == 200
        refused(harness, SigningKey('file-2', 'ES256').sign(claims()), '(kid)')


# ---------------------------------------------------------------- without, and at start-up
def test_without_jwt_settings_a_jwt_is_an_unknown_token(api):
    response = api.client(jwt.encode(claims(), SECRET, algorithm='HS256')).get(JOBS)
    assert response.status == 401
    assert response.json['error']['message'].startswith('A valid bearer token is required')
    assert api.a.get(JOBS).status == 200


@pytest.mark.parametrize(
    'settings, named',
    [
        ({'AIJOB_JWT_SECRET': 'short'}, 'AIJOB_JWT_SECRET'),
        (
            {'AIJOB_JWT_SECRET': SECRET, 'AIJOB_JWT_JWKS_URL': 'https://login.example.com/k'},
            'one JWT key source',
        ),
        ({'AIJOB_JWT_AUDIENCE': 'aijob'}, 'AIJOB_JWT_AUDIENCE is set but no JWT key source'),
        ({'AIJOB_JWT_JWKS_FILE': '/nonexistent/jwks.json'}, 'AIJOB_JWT_JWKS_FILE'),
        ({'AIJOB_CORS_ORIGINS': 'https://app.example.com/page'}, 'AIJOB_CORS_ORIGINS'),
    ],
)
def test_start_up_refuses_jwt_settings_that_cannot_work(settings, named):
    with pytest.raises(ConfigError) as refusal:
        load_config(settings)
    assert named in str(refusal.value)
    assert SECRET not in str(refusal.value)
