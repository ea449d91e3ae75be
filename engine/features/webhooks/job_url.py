"""A job's own ``webhookUrl`` (architecture decision 15): a field of the create body that the
kernel takes from this feature (the hook point create_fields). Given, it is checked by the URL
rule before anything is written, kept as an endpoint of that one job in the creating
transaction, and part of the request's idempotency fingerprint."""

from ...core.errors import WebhooksUnavailableError
from ...core.extension import CreateField
from .urls import MAX_URL_CHARS, check_url

FIELD = 'webhookUrl'
SCHEMA = {
    'type': ['string', 'null'],
    'format': 'uri',
    'pattern': '^https?://',
    'maxLength': MAX_URL_CHARS,
    'description': 'POSTed the terminal status, signed with the secret of '
    'GET /api/ai/webhooks/job-secret; https, public addresses only '
    '(WEBHOOK_URL_REFUSED otherwise).',
}


def job_url_field(repository, policy, signer):
    """The CreateField of ``webhookUrl`` over the feature's repository, URL rule and signer."""

    def check(user_id, url):
        check_url(url, policy, field=FIELD)
        # After the URL's own checks: a bad body is a 400 on every server, 503 only for a
        # valid one on a server that cannot sign (no master key).
        if not signer.enabled:
            raise WebhooksUnavailableError()

    def write(user_id, job_id, url):
        repository.create_endpoint(user_id, url, job_id=job_id)

    return CreateField(FIELD, check, write, SCHEMA)
