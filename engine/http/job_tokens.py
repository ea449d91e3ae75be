"""A job's ``publicAccessToken``: what a browser may hold to follow one job (issue 33).

A create answers with one. It is signed by aijob (HS256 through PyJWT, with a key of its own:
derived from the credential master key when one is set, else a random secret kept in the
``app_secret`` table), so every process verifies it across restarts; it has no database row and
cannot be revoked: it is short-lived instead (AIJOB_PUBLIC_TOKEN_TTL_S). It names the job and
its owner, and is good for that job's read, poll, stream and cancel only (access.py).
"""

import hashlib
import hmac
import secrets
import threading
import time

import jwt

from ..core.errors import UnauthorizedError
from ..core.models import AppSecret
from .auth import ROLE_JOB, Principal

PREFIX = 'pat_'
AUDIENCE = 'aijob:job'
ALGORITHM = 'HS256'
# The host clocks of the web processes may differ a little.
LEEWAY_S = 5
SECRET_NAME = 'public_access_token'
MASTER_KEY_LABEL = b'aijob/public-access-token/v1'


def is_job_token(token):
    return token.startswith(PREFIX)


class JobTokens:
    def __init__(self, store, master_key, ttl_s):
        self.store = store
        self.master_key = master_key
        self.ttl_s = ttl_s
        self._key = None
        self._lock = threading.Lock()

    def issue(self, job):
        """A token for ``job``, good for ttl_s from now."""
        now = int(time.time())
        claims = {
            'aud': AUDIENCE,
            'sub': job.user_id,
            'job': job.id,
            'iat': now,
            'exp': now + self.ttl_s,
        }
        return PREFIX + jwt.encode(claims, self._signing_key(), algorithm=ALGORITHM)

    def principal(self, token):
        """The job token's principal, or 401: expired, or not one of ours."""
        try:
            claims = jwt.decode(
                token[len(PREFIX) :],
                self._signing_key(),
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                leeway=LEEWAY_S,
                options={'require': ['exp', 'sub', 'job']},
            )
        except jwt.ExpiredSignatureError:
            raise UnauthorizedError('the publicAccessToken has expired') from None
        except jwt.PyJWTError:
            raise UnauthorizedError('the publicAccessToken is not valid') from None
        return Principal(str(claims['sub']), ROLE_JOB, job_id=str(claims['job']))

    def _signing_key(self):
        with self._lock:
            if self._key is None:
                self._key = self._load_key()
            return self._key

    def _load_key(self):
        if self.master_key is not None:
            return hmac.new(self.master_key, MASTER_KEY_LABEL, hashlib.sha256).digest()
        # The first process to need it makes it; every other process (and restart) reads it.
        AppSecret.insert(
            name=SECRET_NAME, value=secrets.token_hex(32), created_at=self.store.now()
        ).on_conflict_ignore().execute()
        return AppSecret.get(AppSecret.name == SECRET_NAME).value.encode('ascii')
