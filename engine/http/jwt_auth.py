"""JSON Web Tokens the application signs for its users (AIJOB_JWT_*): HS256 with a shared secret,
or RS256/ES256 with the keys of a JWKS (a URL, fetched and cached; or a file). PyJWT makes every
check (signature, algorithm, exp, nbf, iat, iss, aud); this module only chooses the key and says
which check failed. ``sub`` is the user; a JWT is never more than the user role.
"""

import json
import threading
import time
import urllib.request
from collections import deque

import jwt

from ..core.errors import UnauthorizedError
from .auth import ROLE_USER, USER_ID_PATTERN, Principal

HS_ALGORITHMS = ('HS256',)
KEY_SET_ALGORITHMS = ('RS256', 'ES256')
# A fetched key set is used this long, then fetched again at the next token.
JWKS_MAX_AGE_S = 300.0
# Fetches forced by unknown kids, at most this many a minute: a stream of made-up kids must not
# turn every request into a fetch of the key set.
JWKS_REFRESHES_PER_MINUTE = 6
JWKS_TIMEOUT_S = 5.0
JWKS_MAX_BYTES = 1 << 20

# What each PyJWT refusal says to the client: the check that failed, never a key.
FAILED_CHECKS = (
    (jwt.ExpiredSignatureError, 'the JWT has expired (exp)'),
    (jwt.ImmatureSignatureError, 'the JWT is not valid yet (nbf)'),
    (jwt.InvalidIssuedAtError, 'the JWT was issued in the future (iat)'),
    (jwt.InvalidAudienceError, 'the JWT is for another audience (aud)'),
    (jwt.InvalidIssuerError, 'the JWT is from another issuer (iss)'),
    (jwt.InvalidAlgorithmError, 'the JWT is signed with an algorithm not accepted here (alg)'),
    (jwt.InvalidSignatureError, 'the JWT signature does not verify (signature)'),
)


def looks_like_jwt(token):
    """Three base64url parts: worth trying as a JWT (our own tokens never have a dot)."""
    return token.count('.') == 2


class JwtVerifier:
    """The configured JWT check, or ``enabled`` False when no AIJOB_JWT_* key source is set."""

    def __init__(self, config):
        self.issuer = config.jwt_issuer
        self.audience = config.jwt_audience
        self.leeway = config.jwt_leeway_s
        self.secret = config.jwt_secret
        self.keys = None
        if config.jwt_jwks_url:
            self.keys = KeySet(url=config.jwt_jwks_url)
        elif config.jwt_jwks_file:
            self.keys = KeySet(path=config.jwt_jwks_file)

    @property
    def enabled(self):
        return self.secret is not None or self.keys is not None

    def principal(self, token):
        """The user the JWT names, or UnauthorizedError saying which check failed."""
        try:
            key, algorithms = self._key(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={'require': ['exp', 'sub']},
            )
        except jwt.MissingRequiredClaimError as exc:
            raise UnauthorizedError('the JWT has no %s claim' % exc.claim) from None
        except jwt.PyJWTError as exc:
            raise UnauthorizedError(_failed_check(exc)) from None
        subject = claims['sub']
        if not isinstance(subject, str) or not USER_ID_PATTERN.match(subject):
            raise UnauthorizedError('the JWT sub is not a user id (1-64 characters, no spaces)')
        return Principal(subject, ROLE_USER)

    def _key(self, token):
        if self.secret is not None:
            return self.secret, list(HS_ALGORITHMS)
        header = jwt.get_unverified_header(token)
        if header.get('alg') not in KEY_SET_ALGORITHMS:
            raise jwt.InvalidAlgorithmError(header.get('alg'))
        key = self.keys.find(header.get('kid'), header['alg'])
        return key, [header['alg']]


def _failed_check(exc):
    for kind, message in FAILED_CHECKS:
        if isinstance(exc, kind):
            return message
    if isinstance(exc, UnknownKeyError):
        return str(exc)
    return 'the JWT is malformed'


class UnknownKeyError(jwt.PyJWTError):
    """No key of the set fits the token (its text names no key)."""


class KeySet:
    """The keys of a JWKS URL (fetched when older than JWKS_MAX_AGE_S, or once more when a token
    names a kid the set lacks) or of a file (read once)."""

    def __init__(self, url=None, path=None):
        self.url = url
        self._lock = threading.Lock()
        self._keys = {}
        self._fetched_at = None
        self._forced = deque()  # monotonic times of fetches an unknown kid forced
        if path is not None:
            with open(path, encoding='utf-8') as file:
                self._keys = _parse(json.load(file))

    def find(self, kid, algorithm):
        with self._lock:
            if self.url is not None and self._stale():
                self._fetch()
            key = self._match(kid, algorithm)
            if key is None and self.url is not None and self._may_force():
                self._fetch()
                key = self._match(kid, algorithm)
        if key is None:
            raise UnknownKeyError('the JWT names no known signing key (kid)')
        return key

    def _match(self, kid, algorithm):
        if kid is not None:
            key = self._keys.get(kid)
        else:  # no kid: the set's one key for this algorithm, if it has exactly one
            fitting = [k for k in self._keys.values() if _fits(k, algorithm)]
            key = fitting[0] if len(fitting) == 1 else None
        return key if key is not None and _fits(key, algorithm) else None

    def _stale(self):
        return self._fetched_at is None or time.monotonic() - self._fetched_at > JWKS_MAX_AGE_S

    def _may_force(self):
        now = time.monotonic()
        while self._forced and now - self._forced[0] > 60.0:
            self._forced.popleft()
        if len(self._forced) >= JWKS_REFRESHES_PER_MINUTE:
            return False
        self._forced.append(now)
        return True

    def _fetch(self):
        try:
            with urllib.request.urlopen(self.url, timeout=JWKS_TIMEOUT_S) as reply:
                self._keys = _parse(json.loads(reply.read(JWKS_MAX_BYTES)))
        except (OSError, ValueError):
            # The old keys stay; a token they do not verify is refused as unknown.
            self._fetched_at = time.monotonic()
            return
        self._fetched_at = time.monotonic()


def _parse(document):
    """{kid: PyJWK} of a JWKS document's usable signing keys (others are skipped)."""
    keys = {}
    for index, entry in enumerate(document.get('keys') or ()):
        if not isinstance(entry, dict) or entry.get('use', 'sig') != 'sig':
            continue
        try:
            key = jwt.PyJWK(entry)
        except jwt.PyJWTError:
            continue
        keys[entry.get('kid') or '#%d' % index] = key
    return keys


def _fits(key, algorithm):
    """Is ``key`` one for ``algorithm`` (an RSA key for RS256, a P-256 key for ES256)?"""
    return key.algorithm_name == algorithm
