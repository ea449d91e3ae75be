"""Webhook endpoints and deliveries as the API shows them, and the checks of what a client sends
(architecture decision 15). Plain values in and out; the routes are in app.py."""

from ..core.errors import (
    InvalidRequestError,
    WebhookDeliveryInFlightError,
    WebhookDeliveryNotFoundError,
    WebhookNotFoundError,
    WebhooksUnavailableError,
)
from ..core.outbox import TERMINAL_EVENTS
from ..core.webhook_urls import check_url
from ..core.webhooks import STATUSES
from .params import whole_number
from .views import iso

EVENT_TYPES = tuple(TERMINAL_EVENTS.values())
ENDPOINT_FIELDS = ('url', 'events', 'jobTypes')
DELIVERY_FILTERS = ('status', 'endpointId', 'jobId', 'limit', 'cursor')
DEFAULT_DELIVERY_PAGE, MAX_DELIVERY_PAGE = 50, 100
MAX_LIST_ITEMS = 20


class WebhookEndpoints:
    """What the webhook routes do, over the runtime's repository, URL rule and signer."""

    def __init__(self, runtime):
        self.webhooks = runtime.webhooks
        self.policy = runtime.webhook_policy
        self.signer = runtime.webhook_signer
        self.registry = runtime.registry

    def require_signer(self):
        if not self.signer.enabled:
            raise WebhooksUnavailableError()

    def create(self, user_id, body):
        """A new endpoint with its signing secret, which is shown this once."""
        unknown = sorted(set(body) - set(ENDPOINT_FIELDS))
        if unknown:
            raise InvalidRequestError(
                '%s is not an endpoint field (allowed: %s)'
                % (unknown[0], ', '.join(ENDPOINT_FIELDS)),
                field=unknown[0],
            )
        events = _name_list(body.get('events'), 'events', EVENT_TYPES)
        job_types = _name_list(
            body.get('jobTypes'), 'jobTypes', [d.job_type for d in self.registry.get_all()]
        )
        check_url(body.get('url'), self.policy, field='url')
        self.require_signer()  # a bad body is a 400 on every server; 503 only for a valid one
        endpoint = self.webhooks.create_endpoint(user_id, body['url'], events, job_types)
        shown = endpoint_view(endpoint)
        shown['secret'] = self.signer.endpoint_secret(endpoint.id)
        return shown

    def list(self, user_id):
        return {'items': [endpoint_view(e) for e in self.webhooks.list_endpoints(user_id)]}

    def delete(self, user_id, endpoint_id):
        if not self.webhooks.delete_endpoint(user_id, endpoint_id):
            raise WebhookNotFoundError()

    def job_secret(self, user_id):
        """The secret that signs deliveries to the webhookUrl of the caller's jobs."""
        self.require_signer()
        return {'secret': self.signer.user_secret(user_id)}

    def list_deliveries(self, params):
        unknown = sorted(set(params) - set(DELIVERY_FILTERS))
        if unknown:
            raise InvalidRequestError(
                'unknown query parameter %s (allowed: %s)'
                % (unknown[0], ', '.join(DELIVERY_FILTERS)),
                field=unknown[0],
            )
        status = params.get('status') or None
        if status is not None and status not in STATUSES:
            raise InvalidRequestError(
                'status must be one of %s' % ', '.join(STATUSES), field='status'
            )
        limit = _limit(params.get('limit'))
        rows = self.webhooks.list_deliveries(
            status=status,
            endpoint_id=params.get('endpointId') or None,
            job_id=params.get('jobId') or None,
            limit=limit + 1,
            before=params.get('cursor') or None,
        )
        page = rows[:limit]
        next_cursor = page[-1].id if len(rows) > limit else None
        return {'items': [delivery_view(d) for d in page], 'nextCursor': next_cursor}

    def redeliver(self, delivery_id):
        if self.webhooks.get_delivery(delivery_id) is None:
            raise WebhookDeliveryNotFoundError()
        if not self.webhooks.redeliver(delivery_id):
            raise WebhookDeliveryInFlightError()
        return delivery_view(self.webhooks.get_delivery(delivery_id))


def endpoint_view(endpoint):
    return {
        'webhookId': endpoint.id,
        'url': endpoint.url,
        'events': list(endpoint.events or EVENT_TYPES),
        'jobTypes': endpoint.job_types,
        'createdAt': iso(endpoint.created_at),
    }


def delivery_view(delivery):
    endpoint = delivery.endpoint
    return {
        'deliveryId': delivery.id,
        'endpointId': delivery.endpoint_id,
        'userId': endpoint.user_id,
        'url': endpoint.url,
        'jobId': delivery.job_id,
        'eventType': delivery.event_type,
        'status': delivery.status,
        'attemptCount': delivery.attempt_count,
        'lastStatusCode': delivery.last_status_code,
        'lastError': delivery.last_error,
        'nextAttemptAt': iso(delivery.next_attempt_at),
        'deliveredAt': iso(delivery.delivered_at),
        'createdAt': iso(delivery.created_at),
    }


def _name_list(value, field, allowed):
    """None (all), or a non-empty list of distinct names from ``allowed``."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not 0 < len(value) <= MAX_LIST_ITEMS
        or not all(isinstance(item, str) for item in value)
    ):
        raise InvalidRequestError(
            '%s must be a list of 1 to %d names' % (field, MAX_LIST_ITEMS), field=field
        )
    unknown = [item for item in value if item not in allowed]
    if unknown:
        raise InvalidRequestError('%s: unknown name %r' % (field, unknown[0][:64]), field=field)
    return list(dict.fromkeys(value))


def _limit(raw):
    if raw is None or raw == '':
        return DEFAULT_DELIVERY_PAGE
    limit = whole_number(raw, 1, MAX_DELIVERY_PAGE)
    if limit is None:
        raise InvalidRequestError(
            'limit must be a whole number 1..%d' % MAX_DELIVERY_PAGE, field='limit'
        )
    return limit
