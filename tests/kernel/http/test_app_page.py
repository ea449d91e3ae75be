"""README "Using aijob from your application", end to end in a real browser (issue 33): an
application's server creates a job for its user with a service key; the page of the README (its
script verbatim), served from another origin, follows the job with the publicAccessToken through
CORS and the event stream until it has succeeded. Both backend pairs, a real ``serve``."""

import http.server
import json
import re
import threading
import urllib.request
from pathlib import Path

import pytest

from engine.http.auth import TokenStore
from tests.support import paths
from tests.support.servers import serve_process  # noqa: F401

pytestmark = pytest.mark.slow

README = Path(paths.ROOT) / 'README.md'
SECTION = '## Using aijob from your application'


def readme_page():
    """The section's HTML page, and the line that calls ``follow`` (which the test replaces)."""
    text = README.read_text(encoding='utf-8')
    section = text[text.index(SECTION) :]
    page = re.search(r'```html\n(.*?)```', section, re.S).group(1)
    call = re.search(r'^follow\(.*\);$', page, re.M).group(0)
    return page, call


class PageServer:
    """The application's page on its own origin (another port of the loopback)."""

    def __init__(self):
        self.html = ''
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                data = site.html.encode('utf-8')
                self.send_response(200)
                self.send_header('Content-Type', 'text/html; charset=utf-8')
                self.send_header('Content-Length', str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.origin = 'http://127.0.0.1:%d' % self.httpd.server_port
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def create_for_user(base, service_key):
    body = {
        'jobType': 'synthetic',
        'targetType': 'note',
        'targetId': 'n1',
        'userId': 'u-42',
        'input': {'sleepMs': 1500, 'progressSteps': 5, 'output': {'hello': 'world'}},
    }
    request = urllib.request.Request(
        base + '/api/ai/jobs',
        data=json.dumps(body).encode(),
        method='POST',
        headers={'Authorization': 'Bearer ' + service_key, 'Content-Type': 'application/json'},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def test_the_readme_page_follows_a_job_from_another_origin(
    backend,
    make_runtime,
    serve_process,  # noqa: F811
    chromium,  # the session's browser (tests/support/dashboard.py, a conftest plugin)
):
    runtime = make_runtime()
    with runtime.store.connection():
        service_key = TokenStore(runtime.store).create('my-app', role='service')
    page_html, call = readme_page()
    site = PageServer()  # the page's origin, another port than the API's
    try:
        server = serve_process(backend.env(AIJOB_CORS_ORIGINS=site.origin))
        job = create_for_user(server.base, service_key)
        follow = 'follow(%s, %s, %s);' % (
            json.dumps(server.base),
            json.dumps(job['jobId']),
            json.dumps(job['publicAccessToken']),
        )
        site.html = page_html.replace(call, follow)
        context = chromium.new_context()
        page = context.new_page()
        errors = []
        page.on('pageerror', lambda exc: errors.append(str(exc)))
        page.goto(site.origin + '/')
        page.wait_for_function(
            "document.getElementById('status').textContent === 'succeeded'", timeout=30_000
        )
        assert page.eval_on_selector('#bar', 'bar => bar.value') == 100
        assert errors == []
        context.close()
    finally:
        site.close()
    assert server.stop() == 0, server.log_path.read_text()[-5000:]
