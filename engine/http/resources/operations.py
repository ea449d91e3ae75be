"""The operations resource: liveness, readiness (the store answers a query, the queue takes a
write) and the OpenAPI document itself; with their part of the document. The Prometheus scrape is
the metrics feature's (engine/features/metrics/routes.py)."""

from ...core.errors import AiJobError, NotReadyError
from ..openapi import RETRY_AFTER, error_responses, json_response, ref
from ..replies import error_body, reply


class Operations:
    """/healthz, /readyz and /openapi.json."""

    def __init__(self, runtime, document):
        """``document()``: the OpenAPI document, built from every resource (this one too)."""
        self.runtime = runtime
        self.store = runtime.store
        self.document = document

    def routes(self):
        return (
            ('GET', '/healthz', self.healthz, False),
            ('GET', '/readyz', self.readyz, False),
            ('GET', '/openapi.json', self.openapi_document, False),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        return {
            'Health': {
                'type': 'object',
                'required': ['status'],
                'properties': {'status': {'enum': ['ok', 'ready']}, 'checks': ref('Checks')},
            },
        }

    def healthz(self):
        return reply({'status': 'ok'})

    def readyz(self):
        # A write-free query on the store; a write on the queue, wherever its shards live (a
        # read-only replica or a lost master answers a ping but takes no job).
        checks = {
            'database': _check(self.store.ping),
            'queue': _check(self.runtime.queue.check_ready),
        }
        if all(value == 'ok' for value in checks.values()):
            return reply({'status': 'ready', 'checks': checks})
        not_ready = NotReadyError()
        body = error_body(not_ready.code, not_ready.public_message)
        body['checks'] = checks
        return reply(body, 503, {'Retry-After': str(not_ready.retry_after_s)})

    def openapi_document(self):
        return reply(self.document())


def _check(ping):
    try:
        ping()
        return 'ok'
    except AiJobError:
        return 'unavailable'


def _paths():
    return {
        '/healthz': {
            'get': {
                'summary': 'The process is alive.',
                'security': [],
                'responses': dict(
                    {'200': json_response('Alive.', ref('Health'))}, **error_responses()
                ),
            }
        },
        '/readyz': {
            'get': {
                'summary': 'The database answers a query and the queue takes a write on every '
                'shard (a read-only replica, a wrong node or a lost master is not ready).',
                'security': [],
                'responses': dict(
                    {
                        '200': json_response('Ready.', ref('Health')),
                        '503': json_response(
                            'NOT_READY: a dependency is unreachable or refuses writes; `checks` '
                            'says which.',
                            ref('Error'),
                            RETRY_AFTER,
                        ),
                    },
                    **{'500': error_responses()['500']},
                ),
            }
        },
        '/openapi.json': {
            'get': {
                'summary': 'This document.',
                'security': [],
                'responses': dict(
                    {'200': json_response('OpenAPI 3.1.', {'type': 'object'})}, **error_responses()
                ),
            }
        },
    }
