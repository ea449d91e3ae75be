"""``GET /metrics`` on the API of ``serve`` and ``web``: the Prometheus scrape, for an admin token
or AIJOB_METRICS_TOKEN (never open), with its part of the OpenAPI document; and who may scrape,
which the worker's own port (port.py) asks too."""

import hmac

import bottle

from ...core.errors import ForbiddenError, UnauthorizedError
from ...http import parsing
from ...http.auth import TokenStore, bearer_token
from ...http.openapi import error_responses
from .scrape import CONTENT_TYPE, scrape


class MetricsAccess:
    """Who may scrape: the AIJOB_METRICS_TOKEN bearer, or an admin's token. No token, or an
    unknown one, is UNAUTHORIZED; a user's token is FORBIDDEN."""

    def __init__(self, store, metrics_token):
        self.tokens = TokenStore(store)
        self.metrics_token = metrics_token

    def check(self, authorization_header):
        """Returns the principal (None for the metrics token); the caller holds a connection."""
        token = bearer_token(authorization_header)
        if token is None:
            raise UnauthorizedError()
        if self.metrics_token and hmac.compare_digest(
            token.encode('utf-8'), self.metrics_token.encode('utf-8')
        ):
            return None
        principal = self.tokens.authenticate(token)
        if principal is None:
            raise UnauthorizedError()
        if not principal.is_admin:
            raise ForbiddenError()
        return principal


class MetricsRoutes:
    """GET /metrics."""

    def __init__(self, runtime, access):
        self.runtime = runtime
        self.metrics_access = MetricsAccess(runtime.store, runtime.config.metrics_token)

    def routes(self):
        return (('GET', '/metrics', self.metrics, True),)

    def paths(self):
        return _paths()

    def schemas(self):
        return {}

    def metrics(self):
        """The Prometheus scrape (README "Metrics"): admin token or AIJOB_METRICS_TOKEN."""
        principal = self.metrics_access.check(parsing.header('Authorization'))
        bottle.request.environ['aijob.principal'] = principal
        return bottle.HTTPResponse(
            body=scrape(self.runtime),
            status=200,
            headers={'Content-Type': CONTENT_TYPE, 'Cache-Control': 'no-store'},
        )


def _paths():
    return {
        '/metrics': {
            'get': {
                'summary': 'Prometheus metrics, text exposition format (SUPER_ADMIN, or the '
                'AIJOB_METRICS_TOKEN bearer).',
                'responses': dict(
                    {
                        '200': {
                            'description': 'The scrape.',
                            'content': {'text/plain': {'schema': {'type': 'string'}}},
                        }
                    },
                    **error_responses(401, 403, 503),
                ),
            }
        },
    }
