"""CORS for the pages of AIJOB_CORS_ORIGINS (issue 33): a browser on those origins may call a
job's read, stream and cancel endpoints with a bearer credential (its publicAccessToken, or the
application's JWT). Nothing is allowed for any other origin, and nothing at all by default.

No cookie is involved (the credential is a header), so no Allow-Credentials; ``Vary: Origin``
keeps a shared cache from handing one origin's answer to another.
"""

import bottle

# The bottle paths a page may call, and the request headers it may send them.
PATHS = frozenset(
    (
        '/api/ai/jobs/<job_id>',
        '/api/ai/jobs/<job_id>/artifacts',
        '/api/ai/jobs/<job_id>/events',
        '/api/ai/jobs/<job_id>/stream',
        '/api/ai/jobs/<job_id>/cancel',
    )
)
REQUEST_HEADERS = 'Authorization, If-None-Match, Last-Event-ID'
EXPOSED_HEADERS = 'ETag, Retry-After'
PREFLIGHT_MAX_AGE_S = 600


class Cors:
    """bottle plugin: the CORS headers of the answers of PATHS (installed outside the Guard, so
    that its error answers carry them too: a page can read a 401 or a 404)."""

    api = 2
    name = 'aijob_cors'

    def __init__(self, origins):
        self.origins = frozenset(origins)

    def apply(self, callback, route):
        if not self.origins or route.rule not in PATHS or route.method == 'OPTIONS':
            return callback

        def with_cors(*args, **kwargs):
            result = callback(*args, **kwargs)
            origin = self.allowed_origin()
            if isinstance(result, bottle.HTTPResponse):
                result.add_header('Vary', 'Origin')
                if origin:
                    result.set_header('Access-Control-Allow-Origin', origin)
                    result.set_header('Access-Control-Expose-Headers', EXPOSED_HEADERS)
            return result

        return with_cors

    def allowed_origin(self):
        origin = bottle.request.get_header('Origin')
        return origin if origin in self.origins else None

    def preflight_headers(self, path, allow):
        """The extra headers of an OPTIONS answer: a preflight's, for an allowed origin."""
        if not self.origins or path not in PATHS:
            return {}
        origin = self.allowed_origin()
        if origin is None or not bottle.request.get_header('Access-Control-Request-Method'):
            return {'Vary': 'Origin'}
        return {
            'Vary': 'Origin',
            'Access-Control-Allow-Origin': origin,
            'Access-Control-Allow-Methods': allow,
            'Access-Control-Allow-Headers': REQUEST_HEADERS,
            'Access-Control-Max-Age': str(PREFLIGHT_MAX_AGE_S),
        }
