"""The push part of the OpenAPI document (architecture decision 15): webhook endpoints, the
deliveries operators inspect and redeliver, and the event stream of a job."""

from ..core.webhooks import STATUSES
from .openapi import NULLABLE_TIME, TIME, _errors, _json, _query_param, _ref
from .webhook_views import DEFAULT_DELIVERY_PAGE, EVENT_TYPES, MAX_DELIVERY_PAGE, MAX_LIST_ITEMS


def _path_param(name):
    return {'name': name, 'in': 'path', 'required': True, 'schema': {'type': 'string'}}


def _name_list(description, names=None):
    items = {'enum': list(names)} if names else {'type': 'string'}
    return {
        'type': 'array',
        'items': items,
        'minItems': 1,
        'maxItems': MAX_LIST_ITEMS,
        'description': description,
    }


def push_schemas(job_types):
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
                    'description': 'https (http only with AIJOB_WEBHOOK_ALLOW_HTTP=1); must not '
                    'resolve to a loopback, link-local or private address.',
                },
                'events': _name_list('Event types to send (default: all).', EVENT_TYPES),
                'jobTypes': _name_list('Job types to send (default: all).', job_types),
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
            'properties': {'items': {'type': 'array', 'items': _ref('Webhook')}},
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
                'items': {'type': 'array', 'items': _ref('WebhookDelivery')},
                'nextCursor': {'type': ['string', 'null']},
            },
        },
    }


def _webhook_paths():
    return {
        '/api/ai/webhooks': {
            'post': {
                'summary': 'Register a webhook endpoint for the terminal events of your jobs.',
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': _ref('CreateWebhookRequest')}},
                },
                'responses': dict(
                    {'201': _json('Registered; the secret is shown once.', _ref('CreatedWebhook'))},
                    **_errors(400, 401, 408, 413, 415, 503),
                ),
            },
            'get': {
                'summary': 'Your webhook endpoints (without secrets).',
                'responses': dict(
                    {'200': _json('The endpoints.', _ref('WebhookList'))}, **_errors(401, 503)
                ),
            },
        },
        '/api/ai/webhooks/job-secret': {
            'get': {
                'summary': "The secret that signs deliveries to your jobs' own webhookUrl.",
                'responses': dict(
                    {'200': _json('The secret.', _ref('WebhookSecret'))}, **_errors(401, 503)
                ),
            }
        },
        '/api/ai/webhooks/{webhookId}': {
            'delete': {
                'summary': 'Stop sending to one of your webhook endpoints.',
                'parameters': [_path_param('webhookId')],
                'responses': dict({'204': {'description': 'Deleted.'}}, **_errors(401, 404, 503)),
            }
        },
    }


def _delivery_paths():
    return {
        '/admin-api/ai/webhook-deliveries': {
            'get': {
                'summary': 'Webhook deliveries, newest first (SUPER_ADMIN).',
                'parameters': [
                    _query_param('status', 'Only this status.', {'enum': list(STATUSES)}),
                    _query_param('endpointId', 'Only this endpoint.'),
                    _query_param('jobId', 'Only this job.'),
                    _query_param(
                        'limit',
                        'Page size (default %d).' % DEFAULT_DELIVERY_PAGE,
                        {'type': 'integer', 'minimum': 1, 'maximum': MAX_DELIVERY_PAGE},
                    ),
                    _query_param('cursor', 'The nextCursor of the previous page.'),
                ],
                'responses': dict(
                    {'200': _json('One page.', _ref('WebhookDeliveryList'))},
                    **_errors(400, 401, 403, 503),
                ),
            }
        },
        '/admin-api/ai/webhook-deliveries/{deliveryId}/redeliver': {
            'post': {
                'summary': 'Send a delivery again now, same webhook-id, fresh attempts '
                '(SUPER_ADMIN).',
                'parameters': [_path_param('deliveryId')],
                'responses': dict(
                    {'200': _json('Due now.', _ref('WebhookDelivery'))},
                    **_errors(401, 403, 404, 409, 503),
                ),
            }
        },
    }


# OpenAPI 3.1: a text/event-stream schema describes each event (its fields as sent).
SSE_EVENT = {
    'type': 'object',
    'properties': {
        'event': {'type': 'string'},
        'data': {
            'type': 'string',
            'description': 'JSON: the status, the event row, `{attempt, offset, text}` (delta) '
            'or `{attempt}` (reset).',
        },
        'id': {'type': 'string', 'pattern': '^[0-9]+(-[1-9][0-9]*-[0-9]+)?$'},
        'retry': {'type': 'integer'},
    },
}


def _stream_paths():
    return {
        '/api/ai/jobs/{jobId}/stream': {
            'get': {
                'summary': 'Server-sent events of one job (owner or SUPER_ADMIN) until it ends.',
                'description': 'A fresh stream opens with `event: status` (the JobStatusResponse, '
                'its id the latest event id), then one event per change, named by its kind '
                '(created, dispatched, started, progress, retry_scheduled, fallback, taken_over, '
                'cancel_requested, succeeded, failed, cancelled, ...), data `{id, jobId, kind, '
                'attemptNo, detail, at}`, then the final `event: status`, then it ends. While '
                'the job runs, the text its provider streams comes as `event: delta`, data '
                '`{attempt, offset, text}` (offset: characters of that attempt before this '
                'text), at most one per 100 ms; a retry or fallback starts a new attempt with '
                '`event: reset`, data `{attempt}`: drop the text so far. An event id is '
                '`<historyId>` until the client has text, then `<historyId>-<attempt>-<offset>` '
                '(the text it has). With Last-Event-ID only the events after it are sent, the '
                'text from where the client is (a plain history id: the current attempt from '
                'its start); after the job has ended, no text. Idle: a comment line every '
                'AIJOB_STREAM_HEARTBEAT_MS; closed after AIJOB_STREAM_MAX_S.',
                'parameters': [
                    _path_param('jobId'),
                    {
                        'name': 'Last-Event-ID',
                        'in': 'header',
                        'required': False,
                        'schema': {
                            'type': 'string',
                            'pattern': '^[0-9]{1,19}(-[1-9][0-9]{0,8}-[0-9]{1,12})?$',
                        },
                        'description': 'Resume after this event: its id, `<historyId>` or '
                        '`<historyId>-<attempt>-<offset>`.',
                    },
                ],
                'responses': dict(
                    {
                        '200': {
                            'description': 'The stream (text/event-stream).',
                            'content': {'text/event-stream': {'schema': SSE_EVENT}},
                        },
                        '204': {
                            'description': 'Resumed after the last event of a job that has '
                            'ended: nothing more will come.'
                        },
                    },
                    **_errors(400, 401, 404, 429, 503),
                ),
            }
        },
    }


def push_paths():
    return dict(_webhook_paths(), **_delivery_paths(), **_stream_paths())
