"""Bearer tokens: who is calling the API, and in which role (user, service, SUPER_ADMIN).

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
# An application's server: creates jobs for its end users, follows and cancels them (issue 33).
ROLE_SERVICE = 'service'
# A job's publicAccessToken (job_tokens.py): that one job, for a browser.
ROLE_JOB = 'job'
ROLES = (ROLE_USER, ROLE_SERVICE, ROLE_ADMIN)
TOKEN_PREFIX = 'aj_'
# What a token we issue looks like; anything else is rejected before touching the database.
TOKEN_PATTERN = re.compile(r'^[A-Za-z0-9_-]{16,128}$')
USER_ID_PATTERN = re.compile(r'^[^\s]{1,64}$')


# The characters of a token a list shows: the prefix and 4 of its 43 random ones.
HINT_CHARS = 7
# A token's last use is written at most this often (not a write per request).
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class Principal:
    """Who is calling. ``user_id`` is whose jobs they are: the user (a token, a JWT), the
    owner of the one job a job token names, or for a service ``service:NAME`` (the key of its
    waits and its log lines; a service owns no job). ``name``: the service's name; ``job_id``:
    the one job of a job token."""

    user_id: str
    role: str
    name: str = None
    job_id: str = None

    @property
    def is_admin(self):
        return self.role == ROLE_ADMIN

    @property
    def is_service(self):
        return self.role == ROLE_SERVICE

    @property
    def is_job_token(self):
        return self.role == ROLE_JOB

    @classmethod
    def service(cls, name):
        return cls('service:' + name, ROLE_SERVICE, name=name)


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
        # sha256 -> monotonic time this process last wrote the token's last use
        self._used = {}

    def create(self, user_id, admin=False, role=None):
        """Issue a token for ``user_id`` (for role service: the service's name); returns the
        token (the only time it exists in clear)."""
        return self.issue(user_id, role or (ROLE_ADMIN if admin else ROLE_USER))[0]

    def issue(self, name, role):
        """(token, row id) of a new token of ``role`` for ``name``."""
        if role not in ROLES:
            raise ValueError('a role is one of %s' % ', '.join(ROLES))
        if not isinstance(name, str) or not USER_ID_PATTERN.match(name):
            raise ValueError('a user id or service name is 1-64 characters without spaces')
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = ApiToken.insert(
            token_hash=hash_token(token),
            user_id=name,
            role=role,
            created_at=self.store.now(),
            token_hint=token[:HINT_CHARS],
        ).execute()
        return token, token_id

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
            self._used.clear()
        if row.role == ROLE_SERVICE:
            principal = Principal.service(row.user_id)
        else:
            principal = Principal(row.user_id, row.role)
        self._cache[digest] = (principal, now + TOKEN_CACHE_S)
        self._note_use(digest, now)
        return principal

    def _note_use(self, digest, now):
        """Write the token's last use when this process has not for LAST_USED_EVERY_S; the
        UPDATE itself skips a row another process wrote within that time (database clock)."""
        written = self._used.get(digest)
        if written is not None and now - written < LAST_USED_EVERY_S:
            return
        self._used[digest] = now
        recent = self.store.now_plus_ms(-int(LAST_USED_EVERY_S * 1000))
        ApiToken.update({ApiToken.last_used_at: self.store.now()}).where(
            (ApiToken.token_hash == digest)
            & (ApiToken.last_used_at.is_null() | (ApiToken.last_used_at < recent))
        ).execute()

    def get(self, token_id):
        return ApiToken.get_by_id(token_id)

    def list(self, after_id=0, limit=100):
        """Live tokens with ids above ``after_id``, oldest first: rows, never a token."""
        return list(
            ApiToken.select()
            .where(ApiToken.revoked_at.is_null() & (ApiToken.id > after_id))
            .order_by(ApiToken.id)
            .limit(limit)
        )

    def revoke_id(self, token_id):
        """Revoke the token with this row id; False if unknown or already revoked."""
        return (
            ApiToken.update({ApiToken.revoked_at: self.store.now()})
            .where((ApiToken.id == token_id) & ApiToken.revoked_at.is_null())
            .execute()
            == 1
        )

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
