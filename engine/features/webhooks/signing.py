"""Webhook signatures the Standard Webhooks way (https://www.standardwebhooks.com), so receivers
can use existing verifiers: ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature:
v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` under a secret ``whsec_<base64 key>``.

No secret is stored anywhere: each is derived from AIJOB_CREDENTIAL_MASTER_KEY with HMAC-SHA256,
an endpoint's from its id, and the one that signs jobs' own ``webhookUrl`` from its user. Losing
the database leaks no secret; rotating the master key changes every secret."""

import base64
import hashlib
import hmac
import time

SECRET_PREFIX = 'whsec_'
TOLERANCE_S = 300  # a receiver refuses messages whose timestamp is further off than this


class WebhookSigner:
    def __init__(self, master_key):
        self._master_key = master_key

    @property
    def enabled(self):
        return self._master_key is not None

    def endpoint_secret(self, endpoint_id):
        """The secret of a registered endpoint (shown once, when it is created)."""
        return self._derive(b'aijob-webhook-endpoint:' + endpoint_id.encode('utf-8'))

    def user_secret(self, user_id):
        """The secret that signs deliveries to the ``webhookUrl`` of the user's jobs."""
        return self._derive(b'aijob-webhook-user:' + user_id.encode('utf-8'))

    def secret_for(self, endpoint):
        if endpoint.job_id is not None:
            return self.user_secret(endpoint.user_id)
        return self.endpoint_secret(endpoint.id)

    def _derive(self, label):
        key = hmac.new(self._master_key, label, hashlib.sha256).digest()
        return SECRET_PREFIX + base64.b64encode(key).decode('ascii')


def signature(secret, msg_id, timestamp, body):
    """``v1,<base64 HMAC-SHA256 of "msg_id.timestamp.body">`` under ``secret`` (whsec_…)."""
    key = base64.b64decode(secret[len(SECRET_PREFIX) :])
    signed = ('%s.%d.' % (msg_id, timestamp)).encode('utf-8') + body
    return 'v1,' + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode('ascii')


def signed_headers(secret, msg_id, body, timestamp=None):
    """The headers of one delivery attempt; ``msg_id`` is the same on every retry."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        'Content-Type': 'application/json',
        'User-Agent': 'aijob-webhooks/1',
        'webhook-id': msg_id,
        'webhook-timestamp': str(timestamp),
        'webhook-signature': signature(secret, msg_id, timestamp, body),
    }


def verify(secret, headers, body, now=None, tolerance_s=TOLERANCE_S):
    """What a receiver does (README, "Webhooks"): True if one of the space-separated
    signatures matches and the timestamp is recent. ``headers`` keys are lower-case."""
    msg_id, timestamp = headers['webhook-id'], int(headers['webhook-timestamp'])
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = signature(secret, msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, sig) for sig in headers['webhook-signature'].split())
