"""User model credentials (contracts §8.1, CredentialEncryptionService): users' provider keys kept
in ``user_model_credential`` encrypted with AES-256-GCM under ``AIJOB_CREDENTIAL_MASTER_KEY``, and
the resolver that gives a running job its key. Only ciphertext and a masked key are stored; a key is
never logged, never put in Redis and never returned in clear."""

import base64
import binascii
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core.errors import (
    CredentialError,
    CredentialNotFoundError,
    CredentialStorageUnavailableError,
    CredentialUndecryptableError,
    InvalidRequestError,
)
from ..core.models import UserModelCredential, new_id
from .providers import Credential

NONCE_BYTES = 12
MAX_KEY_CHARS = 512
PROVIDER_PATTERN = re.compile(r'^[a-z][a-z0-9_.-]{0,63}$')


def mask_key(api_key):
    """What a user sees of a key: enough to recognise it, too little to use it."""
    if len(api_key) < 12:
        return '****'
    return '%s...%s' % (api_key[:3], api_key[-4:])


@dataclass(frozen=True)
class CredentialInfo:
    """A stored credential as it may be shown: never the key or its ciphertext."""

    id: str
    user_id: str
    provider: str
    masked_key: str
    created_at: object


class CredentialStore:
    """Runs on the caller's connection (an API request, a worker's unit of work)."""

    def __init__(self, store, master_key):
        self.store = store
        self._aead = AESGCM(master_key) if master_key is not None else None

    @property
    def enabled(self):
        return self._aead is not None

    def register(self, user_id, provider, api_key):
        """Encrypt and keep ``api_key`` for ``user_id``; returns its CredentialInfo. A bad
        request is a 400 whether or not this server can store keys (then 503)."""
        _validate(provider, api_key)
        aead = self._require_aead()
        credential_id = new_id()
        nonce = os.urandom(NONCE_BYTES)
        sealed = aead.encrypt(
            nonce, api_key.encode('utf-8'), _associated_data(credential_id, user_id, provider)
        )
        UserModelCredential.insert(
            id=credential_id,
            user_id=user_id,
            provider=provider,
            encrypted_key=base64.b64encode(nonce + sealed).decode('ascii'),
            masked_key=mask_key(api_key),
            created_at=self.store.now(),
        ).execute()
        return self.get_for_user(user_id, credential_id)

    def list(self, user_id):
        rows = (
            UserModelCredential.select()
            .where(UserModelCredential.user_id == user_id)
            .order_by(UserModelCredential.created_at, UserModelCredential.id)
        )
        return [_info(row) for row in rows]

    def get_for_user(self, user_id, credential_id):
        """The credential if it exists and belongs to ``user_id``, else None."""
        row = self._row(user_id, credential_id)
        return _info(row) if row is not None else None

    def delete(self, user_id, credential_id):
        """True if ``user_id``'s credential was deleted; False if missing or another user's."""
        deleted = (
            UserModelCredential.delete()
            .where(
                (UserModelCredential.id == credential_id) & (UserModelCredential.user_id == user_id)
            )
            .execute()
        )
        return deleted > 0

    def decrypt(self, user_id, credential_id):
        """The clear key of ``user_id``'s credential, for one provider call only.
        CredentialNotFoundError if missing or not owned; CredentialUndecryptableError if the
        master key does not open it."""
        return self.open(user_id, credential_id)[0]

    def open(self, user_id, credential_id):
        """(clear key, the provider it was registered for) of ``user_id``'s credential, with
        ``decrypt``'s errors."""
        row = self._row(user_id, credential_id)
        if row is None:
            raise CredentialNotFoundError(
                'credential %s not found for the job owner' % credential_id
            )
        if self._aead is None:
            raise CredentialUndecryptableError('no AIJOB_CREDENTIAL_MASTER_KEY configured')
        try:
            raw = base64.b64decode(row.encrypted_key)
            clear = self._aead.decrypt(
                raw[:NONCE_BYTES],
                raw[NONCE_BYTES:],
                _associated_data(row.id, row.user_id, row.provider),
            )
        except (InvalidTag, binascii.Error, ValueError):
            raise CredentialUndecryptableError(
                'credential %s does not decrypt under the configured master key' % credential_id
            ) from None
        return clear.decode('utf-8'), row.provider

    def _row(self, user_id, credential_id):
        if not isinstance(credential_id, str) or not credential_id:
            return None
        return UserModelCredential.get_or_none(
            (UserModelCredential.id == credential_id) & (UserModelCredential.user_id == user_id)
        )

    def _require_aead(self):
        if self._aead is None:
            raise CredentialStorageUnavailableError('AIJOB_CREDENTIAL_MASTER_KEY is not set')
        return self._aead


def _validate(provider, api_key):
    if not isinstance(provider, str) or not PROVIDER_PATTERN.match(provider):
        raise InvalidRequestError(
            'provider must be a short lower-case name such as "deepseek"', field='provider'
        )
    if (
        not isinstance(api_key, str)
        or not api_key.strip()
        or len(api_key) > MAX_KEY_CHARS
        or any(ch.isspace() for ch in api_key)
    ):
        raise InvalidRequestError(
            'apiKey must be a non-empty string without spaces, at most %d '
            'characters' % MAX_KEY_CHARS,
            field='apiKey',
        )


def _associated_data(credential_id, user_id, provider):
    # Binds the ciphertext to its row: copied into another user's or another credential's row,
    # it no longer decrypts.
    return ('aijob-credential-v1|%s|%s|%s' % (credential_id, user_id, provider)).encode('utf-8')


def _info(row):
    return CredentialInfo(
        id=row.id,
        user_id=row.user_id,
        provider=row.provider,
        masked_key=row.masked_key,
        created_at=row.created_at,
    )


class CredentialResolver:
    """RESOLVE for both modes: ``platform_key`` from the environment (never in the database);
    ``user_deepseek_key`` from the job's ``credential_id``, which must belong to the job's user."""

    def __init__(self, platform_api_key, credential_store):
        self._platform_api_key = platform_api_key
        self._credential_store = credential_store

    def resolve(self, job):
        if job.credential_mode == 'user_deepseek_key':
            if not job.credential_id:
                raise CredentialNotFoundError('job %s has no credentialId' % job.id)
            api_key, provider = self._credential_store.open(job.user_id, job.credential_id)
            return Credential('user_deepseek_key', api_key, job.credential_id, provider)
        if job.credential_mode == 'platform_key':
            return Credential('platform_key', self._platform_api_key)
        raise CredentialError('credential mode %s is not available' % job.credential_mode)
