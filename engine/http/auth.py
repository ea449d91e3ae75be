"""Bearer tokens: who is calling the API, and in which role.

A token is shown once, when it is created; the store keeps only its SHA-256. A lookup hashes the
presented token first and finds the row by that hash, so the database never compares secret
material and the time a lookup takes says nothing useful about any stored token; the final check
is ``hmac.compare_digest`` all the same.
"""

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from ..core.models import ApiToken

ROLE_USER = 'user'
ROLE_ADMIN = 'SUPER_ADMIN'
TOKEN_PREFIX = 'aj_'
# What a token we issue looks like; anything else is rejected before touching the database.
TOKEN_PATTERN = re.compile(r'^[A-Za-z0-9_-]{16,128}$')
USER_ID_PATTERN = re.compile(r'^[^\s]{1,64}$')


@dataclass(frozen=True)
class Principal:
    user_id: str
    role: str

    @property
    def is_admin(self):
        return self.role == ROLE_ADMIN


def hash_token(token):
    return hashlib.sha256(token.encode('utf-8')).hexdigest()


def bearer_token(authorization_header):
    """The token of an ``Authorization: Bearer …`` header, or None when missing or malformed."""
    scheme, _, token = (authorization_header or '').strip().partition(' ')
    token = token.strip()
    if scheme.lower() != 'bearer' or not TOKEN_PATTERN.match(token):
        return None
    return token


# How long a process trusts a token it has looked up: a revocation takes effect within this.
TOKEN_CACHE_S = 0.9
TOKEN_CACHE_SIZE = 10_000


class TokenStore:
    def __init__(self, store):
        self.store = store
        # sha256 -> (Principal, monotonic expiry): a client polling a job costs one read per
        # second for its token instead of one per request. Only live tokens are kept.
        self._cache = {}

    def create(self, user_id, admin=False):
        """Issue a token for ``user_id``; returns the token (the only time it exists in clear)."""
        if not isinstance(user_id, str) or not USER_ID_PATTERN.match(user_id):
            raise ValueError('a user id is 1-64 characters without spaces')
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        ApiToken.insert(
            token_hash=hash_token(token),
            user_id=user_id,
            role=ROLE_ADMIN if admin else ROLE_USER,
            created_at=self.store.now(),
        ).execute()
        return token

    def authenticate(self, token):
        """The Principal for a live token, or None (unknown, revoked or malformed)."""
        if token is None or not TOKEN_PATTERN.match(token):
            return None
        digest = hash_token(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        row = ApiToken.get_or_none(ApiToken.token_hash == digest)
        if (
            row is None
            or row.revoked_at is not None
            or not hmac.compare_digest(row.token_hash, digest)
        ):
            self._cache.pop(digest, None)
            return None
        if len(self._cache) >= TOKEN_CACHE_SIZE:
            self._cache.clear()  # many distinct tokens: start over rather than grow
        principal = Principal(row.user_id, row.role)
        self._cache[digest] = (principal, now + TOKEN_CACHE_S)
        return principal

    def revoke(self, token):
        """Revoke one token; False if it was unknown or already revoked."""
        return (
            ApiToken.update({ApiToken.revoked_at: self.store.now()})
            .where((ApiToken.token_hash == hash_token(token)) & ApiToken.revoked_at.is_null())
            .execute()
            == 1
        )

    def revoke_user(self, user_id):
        """Revoke every live token of ``user_id``; returns how many."""
        return (
            ApiToken.update({ApiToken.revoked_at: self.store.now()})
            .where((ApiToken.user_id == user_id) & ApiToken.revoked_at.is_null())
            .execute()
        )
