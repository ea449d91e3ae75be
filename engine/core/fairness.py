"""How the queues tell users apart without knowing them: the opaque user key a queue message
carries, and the per-user weights of the fair rotation (AIJOB_USER_WEIGHTS).

A queue (Redis, or the process) must never hold a user id in clear (contracts §8.5): a message
names its user by a short digest of the id instead. The digest is stable across processes and
restarts, so every process files one user's messages under the same key.
"""

import hashlib

USER_KEY_CHARS = 16  # 64 bits of SHA-256: collisions among a service's users are negligible


def user_key(user_id):
    """The opaque key of ``user_id`` in the queues ('' for no user)."""
    if not user_id:
        return ''
    digest = hashlib.sha256(('aijob-queue-user:%s' % user_id).encode('utf-8')).hexdigest()
    return digest[:USER_KEY_CHARS]


def weights_by_key(weights):
    """AIJOB_USER_WEIGHTS ({user id: weight}) keyed by user key, the way the queues read it;
    weights of 1 (the default) are left out."""
    return {user_key(user): int(weight) for user, weight in (weights or {}).items() if weight != 1}
