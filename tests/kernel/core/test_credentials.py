"""User credentials: AES-256-GCM at rest, masked when shown, owned by one user; the resolver
that gives a job its key (contracts §8.1)."""

import base64

import pytest

from engine.core.errors import ConfigError, InvalidRequestError
from engine.core.models import UserModelCredential
from engine.execution.credentials import (
    CredentialNotFoundError,
    CredentialStorageUnavailableError,
    CredentialStore,
    CredentialUndecryptableError,
    mask_key,
)
from engine.execution.providers import Credential
from engine.execution.services import build_ai_services
from engine.extensions import load_config
from tests.support.helpers import create_job

OTHER_MASTER = base64.b64encode(b'j' * 32).decode()
KEY_A = 'sk-user-a-3f9c1e77d2b84a6b9e01'


def test_a_registered_key_is_stored_encrypted_and_shown_masked(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    assert info.masked_key == 'sk-...9e01' and info.provider == 'deepseek' and info.created_at
    dump = repr(list(UserModelCredential.select().dicts()))
    dump += repr(
        keyed_runtime.store.db.execute_sql('SELECT * FROM user_model_credential').fetchall()
    )
    assert KEY_A not in dump and KEY_A[3:] not in dump
    assert 'encrypted_key' not in repr(info) and KEY_A not in repr(info)


def test_the_owner_gets_the_key_back_in_clear_only_by_decrypting(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    assert keyed_runtime.ai.credential_store.decrypt('user-a', info.id) == KEY_A


def test_another_user_can_neither_see_use_nor_delete_a_credential(keyed_runtime):
    store = keyed_runtime.ai.credential_store
    info = store.register('user-a', 'deepseek', KEY_A)
    assert store.list('user-b') == []
    assert store.get_for_user('user-b', info.id) is None
    with pytest.raises(CredentialNotFoundError):
        store.decrypt('user-b', info.id)
    assert store.delete('user-b', info.id) is False
    assert [c.id for c in store.list('user-a')] == [info.id]


def test_the_owner_deletes_a_credential_once(keyed_runtime):
    store = keyed_runtime.ai.credential_store
    info = store.register('user-a', 'deepseek', KEY_A)
    assert store.delete('user-a', info.id) is True
    assert store.delete('user-a', info.id) is False
    assert store.list('user-a') == []


def test_a_wrong_master_key_makes_the_credential_undecryptable(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    other = CredentialStore(keyed_runtime.store, base64.b64decode(OTHER_MASTER))
    with pytest.raises(CredentialUndecryptableError) as caught:
        other.decrypt('user-a', info.id)
    assert caught.value.code == 'CREDENTIAL_UNDECRYPTABLE' and not caught.value.retryable


def test_a_ciphertext_copied_to_another_users_row_does_not_decrypt(keyed_runtime):
    store = keyed_runtime.ai.credential_store
    mine = store.register('user-a', 'deepseek', KEY_A)
    theirs = store.register('user-b', 'deepseek', 'sk-user-b-000000000000000')
    sealed = UserModelCredential.get_by_id(mine.id).encrypted_key
    UserModelCredential.update(encrypted_key=sealed).where(
        UserModelCredential.id == theirs.id
    ).execute()
    with pytest.raises(CredentialUndecryptableError):
        store.decrypt('user-b', theirs.id)


def test_without_a_master_key_keys_cannot_be_registered(make_runtime):
    runtime = make_runtime()
    with runtime.store.connection(), pytest.raises(CredentialStorageUnavailableError):
        runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)


@pytest.mark.parametrize(
    'provider, api_key',
    [('deepseek', ''), ('deepseek', 'sk with space'), ('DeepSeek!', KEY_A), ('deepseek', None)],
)
def test_malformed_registrations_are_rejected(keyed_runtime, provider, api_key):
    with pytest.raises(InvalidRequestError):
        keyed_runtime.ai.credential_store.register('user-a', provider, api_key)


def test_short_keys_are_masked_completely():
    assert mask_key('abc123') == '****'


@pytest.mark.parametrize('value', ['not base64!', base64.b64encode(b'x' * 16).decode()])
def test_a_malformed_master_key_stops_start_up_without_echoing_it(value):
    with pytest.raises(ConfigError) as caught:
        load_config({'AIJOB_CREDENTIAL_MASTER_KEY': value})
    assert value not in str(caught.value)


# ---------------------------------------------------------------- the resolver
def user_key_job(keyed_runtime, user_id, credential_id):
    return create_job(
        keyed_runtime,
        job_type='flashcard_generation',
        user_id=user_id,
        input={'text': 'Some text.'},
        overrides={'credentialMode': 'user_deepseek_key', 'credentialId': credential_id},
    )


def test_a_user_key_job_resolves_to_the_owners_decrypted_key(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    credential = keyed_runtime.ai.credentials.resolve(
        user_key_job(keyed_runtime, 'user-a', info.id)
    )
    assert credential == Credential('user_deepseek_key', KEY_A, info.id)
    assert KEY_A not in repr(credential)


def test_a_job_naming_another_users_credential_fails_credential_not_found(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    with pytest.raises(CredentialNotFoundError) as caught:
        keyed_runtime.ai.credentials.resolve(user_key_job(keyed_runtime, 'user-b', info.id))
    assert caught.value.code == 'CREDENTIAL_NOT_FOUND' and not caught.value.retryable


def test_a_deleted_credential_fails_the_job_credential_not_found(keyed_runtime):
    info = keyed_runtime.ai.credential_store.register('user-a', 'deepseek', KEY_A)
    job = user_key_job(keyed_runtime, 'user-a', info.id)
    keyed_runtime.ai.credential_store.delete('user-a', info.id)
    with pytest.raises(CredentialNotFoundError):
        keyed_runtime.ai.credentials.resolve(job)


def test_platform_mode_takes_the_key_from_the_environment(keyed_runtime):
    job = create_job(keyed_runtime, job_type='flashcard_generation', input={'text': 'Some text.'})
    assert keyed_runtime.ai.credentials.resolve(job) == Credential(
        'platform_key', 'sk-platform-0000000000'
    )


def test_without_a_master_key_the_store_is_disabled():
    ai = build_ai_services(load_config({}), store=None)
    assert ai.credential_store.enabled is False
