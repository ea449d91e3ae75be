"""A small in-process WSGI client for the API tests, and the OpenAPI check it applies to every
response: the status must be documented for that operation and the body must validate against
the documented schema. No response may show a traceback, an exception name, a path or SQL."""

import io
import json
import re
import sys
from urllib.parse import urlencode

import jsonschema

# What must never reach a client.
LEAK = re.compile(
    r'Traceback|File "|\.py\b|\b[A-Z][A-Za-z]*(Error|Exception)\b|'
    r'\bSELECT\b|\bINSERT\b|\bUPDATE `|/work/|site-packages'
)


def call_wsgi(app, environ):
    """Run one request through a WSGI app: (status code, headers, whole body)."""
    captured = {}

    def start_response(status, headers, exc_info=None):
        captured['status'], captured['headers'] = int(status.split()[0]), headers

    chunks = app(environ, start_response)
    try:
        body = b''.join(chunks)
    finally:
        if hasattr(chunks, 'close'):
            chunks.close()
    return captured['status'], captured['headers'], body


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {name.lower(): value for name, value in headers}
        self.body = body

    @property
    def json(self):
        return json.loads(self.body.decode('utf-8'))

    @property
    def error_code(self):
        return self.json['error']['code']

    def __repr__(self):
        return '<Response %d %s>' % (self.status, self.body[:300])


class OpenApiCheck:
    """Validates responses against an OpenAPI 3.1 document (JSON Schema 2020-12 bodies)."""

    def __init__(self, document):
        self.document = document
        self.paths = [
            (re.compile('^' + re.sub(r'\{[^}]+\}', '[^/]+', path) + '$'), path)
            for path in document['paths']
        ]
        self.checked = 0

    def operation(self, method, path):
        for pattern, template in self.paths:
            if pattern.match(path):
                return template, self.document['paths'][template].get(method.lower())
        return None, None

    def check(self, method, path, response):
        template, operation = self.operation(method, path)
        if operation is None:
            # bottle's own answers for unknown paths or methods: still the Error shape.
            assert response.status in (404, 405), (method, path, response)
            self._validate({'$ref': '#/components/schemas/Error'}, response)
        else:
            documented = operation['responses'].get(str(response.status))
            assert documented is not None, 'undocumented %d for %s %s: %r' % (
                response.status,
                method,
                template,
                response,
            )
            content = documented.get('content', {})
            schema = content.get('application/json', {}).get('schema')
            if schema is not None:
                assert response.headers.get('content-type', '').startswith('application/json')
                self._validate(schema, response)
            elif content:  # not JSON (text/plain metrics): the documented media type
                media_type = response.headers.get('content-type', '').split(';')[0].strip()
                assert media_type in content, (method, template, media_type)
            else:
                assert response.body == b'', response
        self.checked += 1

    def _validate(self, schema, response):
        root = dict(schema, components=self.document['components'])
        jsonschema.Draft202012Validator(root).validate(response.json)


class OpenStream:
    """A response whose body is read as it comes: ``chunks`` yields the application's chunks;
    ``close()`` ends it the way a server does when the client goes away."""

    def __init__(self, status, headers, chunks):
        self.status = status
        self.headers = {name.lower(): value for name, value in headers}
        self._chunks = chunks
        self.chunks = iter(chunks)

    def close(self):
        if hasattr(self._chunks, 'close'):
            self._chunks.close()


class WsgiClient:
    def __init__(self, app, token=None, check=None):
        self.app = app
        self.token = token
        self.check = check

    def request(
        self,
        method,
        path,
        json_body=None,
        body=None,
        headers=None,
        query=None,
        content_type=None,
        stream=False,
    ):
        """The response, its body read to the end; with ``stream``, an OpenStream instead."""
        if json_body is not None:
            body = json.dumps(json_body).encode('utf-8')
            content_type = content_type or 'application/json'
        body = body or b''
        environ = {
            'REQUEST_METHOD': method,
            'PATH_INFO': path,
            'SCRIPT_NAME': '',
            'QUERY_STRING': urlencode(query or {}),
            'SERVER_NAME': 'test',
            'SERVER_PORT': '80',
            'SERVER_PROTOCOL': 'HTTP/1.1',
            'wsgi.version': (1, 0),
            'wsgi.url_scheme': 'http',
            'wsgi.input': io.BytesIO(body),
            'wsgi.errors': sys.stderr,
            'wsgi.multithread': True,
            'wsgi.multiprocess': False,
            'wsgi.run_once': False,
            'CONTENT_LENGTH': str(len(body)) if body else '',
        }
        if content_type:
            environ['CONTENT_TYPE'] = content_type
        if self.token:
            environ['HTTP_AUTHORIZATION'] = 'Bearer ' + self.token
        for name, value in (headers or {}).items():
            environ['HTTP_' + name.upper().replace('-', '_')] = value
        if stream:
            return self._open(environ)
        response = self._call(environ)
        assert not LEAK.search(response.body.decode('utf-8', 'replace')), response
        if self.check is not None:
            self.check.check(method, path, response)
        return response

    def _call(self, environ):
        return Response(*call_wsgi(self.app, environ))

    def _open(self, environ):
        captured = {}

        def start_response(status, headers, exc_info=None):
            captured['status'], captured['headers'] = int(status.split()[0]), headers

        chunks = self.app(environ, start_response)
        return OpenStream(captured['status'], captured['headers'], chunks)

    def get(self, path, **kw):
        return self.request('GET', path, **kw)

    def post(self, path, json_body=None, **kw):
        return self.request('POST', path, json_body=json_body, **kw)
