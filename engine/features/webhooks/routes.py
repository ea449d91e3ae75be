"""The webhook resource (architecture decision 15): a user's endpoints for the terminal events of
their jobs (the signing secret shown once, at creation), the secret of their jobs' own
webhookUrl, and the deliveries operators inspect and redeliver; the checks of what a client
sends, the shapes the API shows, and their part of the OpenAPI document."""

import bottle

from ...core.errors import (
    InvalidRequestError,
    WebhookDeliveryInFlightError,
    WebhookDeliveryNotFoundError,
    WebhookNotFoundError,
    WebhooksUnavailableError,
)
from ...core.logs import log_event
from ...core.outbox import TERMINAL_EVENTS
from ...http import parsing
from ...http.openapi import (
    NULLABLE_TIME,
    TIME,
    error_responses,
    json_response,
    path_param,
    query_param,
    ref,
)
from ...http.params import whole_number
from ...http.replies import reply
from ...http.views import iso
from .repository import STATUSES
from .urls import check_url

EVENT_TYPES = tuple(TERMINAL_EVENTS.values())
ENDPOINT_FIELDS = ('url', 'events', 'jobTypes')
DELIVERY_FILTERS = ('status', 'endpointId', 'jobId', 'limit', 'cursor')
DEFAULT_DELIVERY_PAGE, MAX_DELIVERY_PAGE = 50, 100
MAX_LIST_ITEMS = 20


# Any webhook id but job-secret, so that a DELETE of /api/ai/webhooks/job-secret is 405 and its
# Allow header names GET only, as the document says.
WEBHOOK_ID = '<webhook_id:re:(?!job-secret$)[^/]+>'


class WebhookRoutes:
    """The webhook routes, over the feature's repository, URL rule and signer."""

    def __init__(self, runtime, access):
        webhooks = runtime.features['webhooks']
        self.access = access
        self.max_body_bytes = runtime.config.max_body_bytes
        self.webhooks = webhooks.repository
        self.policy = webhooks.policy
        self.signer = webhooks.signer
        self.registry = runtime.registry

    def routes(self):
        return (
            ('POST', '/api/ai/webhooks', self.create_webhook, True),
            ('GET', '/api/ai/webhooks', self.list_webhooks, True),
            ('GET', '/api/ai/webhooks/job-secret', self.webhook_job_secret, True),
            ('DELETE', '/api/ai/webhooks/' + WEBHOOK_ID, self.delete_webhook, True),
            ('GET', '/admin-api/ai/webhook-deliveries', self.admin_list_deliveries, True),
            (
                'POST',
                '/admin-api/ai/webhook-deliveries/<delivery_id>/redeliver',
                self.admin_redeliver,
                True,
            ),
        )

    def paths(self):
        return dict(_webhook_paths(), **_delivery_paths())

    def schemas(self):
        job_types = sorted(d.job_type for d in self.registry.get_all())
        endpoint_properties = {
            'webhookId': {'type': 'string'},
            'url': {'type': 'string'},
            'events': {'type': 'array', 'items': {'enum': list(EVENT_TYPES)}},
            'jobTypes': {'type': ['array', 'null'], 'items': {'type': 'string'}},
            'createdAt': TIME,
        }
        endpoint_required = ['webhookId', 'url', 'events', 'jobTypes', 'createdAt']
        return {
            'CreateWebhookRequest': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['url'],
                'properties': {
                    'url': {
                        'type': 'string',
                        'maxLength': 2048,
                        'description': 'https (http only with AIJOB_WEBHOOK_ALLOW_HTTP=1); must '
                        'not resolve to a loopback, link-local or private address.',
                    },
                    'events': _name_list_schema('Event types to send (default: all).', EVENT_TYPES),
                    'jobTypes': _name_list_schema('Job types to send (default: all).', job_types),
                },
            },
            'Webhook': {
                'type': 'object',
                'additionalProperties': False,
                'required': endpoint_required,
                'properties': endpoint_properties,
            },
            'CreatedWebhook': {
                'type': 'object',
                'additionalProperties': False,
                'required': endpoint_required + ['secret'],
                'properties': dict(
                    endpoint_properties,
                    secret={
                        'type': 'string',
                        'pattern': '^whsec_',
                        'description': 'The signing secret; shown this once.',
                    },
                ),
            },
            'WebhookList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['items'],
                'properties': {'items': {'type': 'array', 'items': ref('Webhook')}},
            },
            'WebhookSecret': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['secret'],
                'properties': {'secret': {'type': 'string', 'pattern': '^whsec_'}},
            },
            'WebhookDelivery': {
                'type': 'object',
                'additionalProperties': False,
                'required': [
                    'deliveryId',
                    'endpointId',
                    'userId',
                    'url',
                    'jobId',
                    'eventType',
                    'status',
                    'attemptCount',
                    'lastStatusCode',
                    'lastError',
                    'nextAttemptAt',
                    'deliveredAt',
                    'createdAt',
                ],
                'properties': {
                    'deliveryId': {'type': 'string', 'description': 'The webhook-id header.'},
                    'endpointId': {'type': 'string'},
                    'userId': {'type': 'string'},
                    'url': {'type': 'string'},
                    'jobId': {'type': 'string'},
                    'eventType': {'enum': list(EVENT_TYPES)},
                    'status': {'enum': list(STATUSES)},
                    'attemptCount': {'type': 'integer', 'minimum': 0},
                    'lastStatusCode': {'type': ['integer', 'null']},
                    'lastError': {'type': ['string', 'null']},
                    'nextAttemptAt': NULLABLE_TIME,
                    'deliveredAt': NULLABLE_TIME,
                    'createdAt': TIME,
                },
            },
            'WebhookDeliveryList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['items', 'nextCursor'],
                'properties': {
                    'items': {'type': 'array', 'items': ref('WebhookDelivery')},
                    'nextCursor': {'type': ['string', 'null']},
                },
            },
        }

    # -- the routes; the secret is shown once, at creation
    def create_webhook(self):
        principal = self.access.caller()
        endpoint = self.create(principal.user_id, parsing.json_object(self.max_body_bytes))
        log_event(
            'webhook.registered', endpoint_id=endpoint['webhookId'], user_id=principal.user_id
        )
        return reply(endpoint, 201)

    def list_webhooks(self):
        return reply(self.list(self.access.caller().user_id))

    def delete_webhook(self, webhook_id):
        principal = self.access.caller()
        self.delete(principal.user_id, webhook_id)
        log_event('webhook.deleted', endpoint_id=webhook_id, user_id=principal.user_id)
        return bottle.HTTPResponse(status=204)

    def webhook_job_secret(self):
        return reply(self.job_secret(self.access.caller().user_id))

    def admin_list_deliveries(self):
        self.access.admin()
        return reply(self.list_deliveries(parsing.query()))

    def admin_redeliver(self, delivery_id):
        self.access.admin()
        delivery = self.redeliver(delivery_id)
        log_event('webhook.redeliver', delivery_id=delivery_id)
        return reply(delivery)

    # -- what the routes do, in plain values
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


def _name_list_schema(description, names=None):
    items = {'enum': list(names)} if names else {'type': 'string'}
    return {
        'type': 'array',
        'items': items,
        'minItems': 1,
        'maxItems': MAX_LIST_ITEMS,
        'description': description,
    }


def _webhook_paths():
    return {
        '/api/ai/webhooks': {
            'post': {
                'summary': 'Register a webhook endpoint for the terminal events of your jobs.',
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': ref('CreateWebhookRequest')}},
                },
                'responses': dict(
                    {
                        '201': json_response(
                            'Registered; the secret is shown once.', ref('CreatedWebhook')
                        )
                    },
                    **error_responses(400, 401, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': 'Your webhook endpoints (without secrets).',
                'responses': dict(
                    {'200': json_response('The endpoints.', ref('WebhookList'))},
                    **error_responses(401, 503),
                ),
            },
        },
        '/api/ai/webhooks/job-secret': {
            'get': {
                'summary': "The secret that signs deliveries to your jobs' own webhookUrl.",
                'responses': dict(
                    {'200': json_response('The secret.', ref('WebhookSecret'))},
                    **error_responses(401, 503),
                ),
            }
        },
        '/api/ai/webhooks/{webhookId}': {
            'delete': {
                'summary': 'Stop sending to one of your webhook endpoints.',
                'parameters': [path_param('webhookId')],
                'responses': dict(
                    {'204': {'description': 'Deleted.'}}, **error_responses(401, 404, 503)
                ),
            }
        },
    }


def _delivery_paths():
    return {
        '/admin-api/ai/webhook-deliveries': {
            'get': {
                'summary': 'Webhook deliveries, newest first (SUPER_ADMIN).',
                'parameters': [
                    query_param('status', 'Only this status.', {'enum': list(STATUSES)}),
                    query_param('endpointId', 'Only this endpoint.'),
                    query_param('jobId', 'Only this job.'),
                    query_param(
                        'limit',
                        'Page size (default %d).' % DEFAULT_DELIVERY_PAGE,
                        {'type': 'integer', 'minimum': 1, 'maximum': MAX_DELIVERY_PAGE},
                    ),
                    query_param('cursor', 'The nextCursor of the previous page.'),
                ],
                'responses': dict(
                    {'200': json_response('One page.', ref('WebhookDeliveryList'))},
                    **error_responses(400, 401, 403, 503),
                ),
            }
        },
        '/admin-api/ai/webhook-deliveries/{deliveryId}/redeliver': {
            'post': {
                'summary': 'Send a delivery again now, same webhook-id, fresh attempts '
                '(SUPER_ADMIN).',
                'parameters': [path_param('deliveryId')],
                'responses': dict(
                    {'200': json_response('Due now.', ref('WebhookDelivery'))},
                    **error_responses(401, 403, 404, 409, 503),
                ),
            }
        },
    }
