"""Dashboard sessions: an admin token exchanged once for a session id in an HttpOnly,
SameSite=Strict cookie, and the CSRF token every action of that session must carry.

The store keeps only the SHA-256 of a session id (as it does for bearer tokens), with the hash of
the admin token it was opened with: a session ends when it expires (by the database clock,
architecture decision 2), when the operator signs out, or when that token is revoked or stops
being an admin's. The CSRF token is an HMAC of the session id, so it needs no storage, differs
per session, and cannot be computed by a page that cannot read the HttpOnly cookie.
"""

import hashlib
import hmac
import secrets

from ...core.models import ApiToken
from ...http.auth import ROLE_ADMIN, Principal, hash_token
from .models import DashboardSession

SESSION_ID_BYTES = 32
_CSRF_CONTEXT = b'aijob-dashboard-csrf'


def hash_session(session_id):
    return hashlib.sha256(session_id.encode('utf-8')).hexdigest()


def csrf_token(session_id):
    """The CSRF token of a session: HMAC-SHA256 keyed by the session id."""
    return hmac.new(session_id.encode('utf-8'), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def csrf_ok(session_id, presented):
    return isinstance(presented, str) and hmac.compare_digest(csrf_token(session_id), presented)


class SessionStore:
    def __init__(self, store, ttl_ms):
        self.store = store
        self.ttl_ms = ttl_ms

    def open(self, principal, token):
        """A new session for an admin ``principal`` signed in with ``token``; returns the
        session id (the only time it exists in clear). Expired sessions are purged meanwhile."""
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        with self.store.atomic():
            DashboardSession.delete().where(
                DashboardSession.expires_at <= self.store.now()
            ).execute()
            DashboardSession.insert(
                session_hash=hash_session(session_id),
                token_hash=hash_token(token),
                user_id=principal.user_id,
                created_at=self.store.now(),
                expires_at=self.store.now_plus_ms(self.ttl_ms),
            ).execute()
        return session_id

    def find(self, session_id):
        """The admin Principal of a live session, or None (unknown, expired, signed out, or its
        token revoked or no longer an admin's). One indexed read."""
        if not session_id or len(session_id) > 128:
            return None
        row = (
            DashboardSession.select(DashboardSession.user_id, ApiToken.role)
            .join(ApiToken, on=(ApiToken.token_hash == DashboardSession.token_hash))
            .where(
                (DashboardSession.session_hash == hash_session(session_id))
                & (DashboardSession.expires_at > self.store.now())
                & ApiToken.revoked_at.is_null()
                & (ApiToken.role == ROLE_ADMIN)
            )
            .tuples()
            .first()
        )
        return Principal(row[0], row[1]) if row else None

    def close(self, session_id):
        """Sign out: the session is gone from the store."""
        DashboardSession.delete().where(
            DashboardSession.session_hash == hash_session(session_id)
        ).execute()
