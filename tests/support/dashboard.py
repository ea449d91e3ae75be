"""The dashboard's test clients: ``FormClient`` (in-process WSGI with a cookie jar and form posts,
keeping every Set-Cookie header) and the ``chromium`` fixture (Playwright driving Debian's
chromium; locally a missing browser skips, under CI it fails)."""

import io
import os
import re
import sys
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest

from tests.support.backends import IN_CI
from tests.support.wsgi import call_wsgi

CHROMIUM = os.environ.get('AIJOB_TEST_CHROMIUM', '/usr/bin/chromium')


class Page:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # [(name, value)] as sent, repeated names kept
        self.body = body
        self.text = body.decode('utf-8')

    def header(self, name):
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def cookies(self):
        """{name: Morsel} of every Set-Cookie header."""
        jar = SimpleCookie()
        for key, value in self.headers:
            if key.lower() == 'set-cookie':
                jar.load(value)
        return dict(jar)

    def csrf(self):
        return re.search(r'name="csrf" value="([^"]+)"', self.text).group(1)

    def __repr__(self):
        return '<Page %d %s>' % (self.status, self.body[:400])


class FormClient:
    """A browser-like client of the WSGI app: keeps cookies, sends Accept: text/html."""

    def __init__(self, app):
        self.app = app
        self.jar = {}

    def get(self, path, query=None, accept='text/html'):
        return self.request('GET', path, query=query, accept=accept)

    def post(self, path, form=None, origin=None, accept='text/html'):
        body = urlencode(form or {}).encode('utf-8')
        return self.request('POST', path, body=body, origin=origin, accept=accept)

    def request(self, method, path, query=None, body=b'', origin=None, accept='text/html'):
        path, _, query_string = path.partition('?')  # a Location header carries its query
        environ = {
            'REQUEST_METHOD': method,
            'PATH_INFO': path,
            'SCRIPT_NAME': '',
            'QUERY_STRING': query_string or urlencode(query or {}),
            'SERVER_NAME': 'test',
            'SERVER_PORT': '80',
            'HTTP_HOST': 'test',
            'SERVER_PROTOCOL': 'HTTP/1.1',
            'wsgi.version': (1, 0),
            'wsgi.url_scheme': 'http',
            'wsgi.input': io.BytesIO(body),
            'wsgi.errors': sys.stderr,
            'wsgi.multithread': True,
            'wsgi.multiprocess': False,
            'wsgi.run_once': False,
            'CONTENT_LENGTH': str(len(body)) if body else '',
            'HTTP_ACCEPT': accept,
        }
        if body:
            environ['CONTENT_TYPE'] = 'application/x-www-form-urlencoded'
        if origin:
            environ['HTTP_ORIGIN'] = origin
        if self.jar:
            environ['HTTP_COOKIE'] = '; '.join('%s=%s' % item for item in self.jar.items())
        page = self._call(environ)
        for name, morsel in page.cookies().items():
            if morsel['max-age'] and int(morsel['max-age']) <= 0 or morsel.value in ('', '""'):
                self.jar.pop(name, None)
            else:
                self.jar[name] = morsel.value
        return page

    def _call(self, environ):
        return Page(*call_wsgi(self.app, environ))

    def sign_in(self, token):
        form = self.get('/dashboard/login')
        return self.post('/dashboard/login', {'csrf': form.csrf(), 'token': token})


@pytest.fixture(scope='session')
def chromium():
    """A headless chromium driven by Playwright, for the whole session."""
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = 'playwright is not installed'
    if problem is None and not os.path.exists(CHROMIUM):
        problem = 'no chromium at %s' % CHROMIUM
    if problem:
        if IN_CI:
            pytest.fail('CI requires the browser: ' + problem)
        pytest.skip(problem)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=['--no-sandbox'])
        try:
            yield browser
        finally:
            browser.close()
