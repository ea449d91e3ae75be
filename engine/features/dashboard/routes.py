"""The operators' dashboard at ``/dashboard``: server-rendered pages (bottle's SimpleTemplate,
which escapes every ``{{value}}``) plus one small script, all served by the API's own app.

Sign-in exchanges an admin token for a session cookie (HttpOnly, SameSite=Strict; the store keeps
only its hash, sessions.py). A user token is refused with 403. Every action is a POST carrying the
session's CSRF token, and one whose Origin is another site is refused as well.
Pages send a Content-Security-Policy that allows only this app's own script and style, so even a
value that escaped escaping could not run.

Errors are HTML pages for a browser (``Accept: text/html``) and the API's JSON error otherwise,
with the same code and status either way.
"""

import http.cookies
import json
import os
import re
from urllib.parse import quote, urlencode, urlsplit

import bottle

from ...core.errors import (
    AiJobError,
    CsrfError,
    InvalidRequestError,
    JobNotFoundError,
    NoSuchEndpointError,
    UnauthorizedError,
)
from ...core.extension import DashboardPage, DashboardPanel
from ...core.logs import log_event
from ...core.registry import QUEUE_NAMES
from ...core.states import RUNNING
from ...http.auth import TokenStore
from . import pages
from .openapi import dashboard_paths
from .sessions import SessionStore, csrf_ok, csrf_token

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, 'templates')
STATIC = os.path.join(HERE, 'static')
PREFIX = '/dashboard'
SESSION_COOKIE = 'aijob_session'
LOGIN_COOKIE = 'aijob_login'  # the sign-in form's own CSRF token (double submit)
_JOB_ID = re.compile(r'^[0-9A-Za-z-]{1,64}$')
_STATIC_NAME = re.compile(r'^[a-z0-9_-]+\.(css|js|svg)$')
_STATIC_TYPES = {'css': 'text/css', 'js': 'text/javascript', 'svg': 'image/svg+xml'}
SECURITY_HEADERS = {
    'Content-Security-Policy': "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    'X-Content-Type-Options': 'nosniff',
    'X-Frame-Options': 'DENY',
    'Referrer-Policy': 'same-origin',
    'Cache-Control': 'no-store',
}
# What an action's redirect may say on the next page: fixed texts, chosen by key.
NOTICES = {
    'signed_out': 'Signed out.',
    'cancelled': 'The job was cancelled.',
    'cancel_requested': 'Cancel requested: the worker stops the job at its next check.',
    'retried': 'This is the new job retrying the old one.',
}


class _SignIn(Exception):
    """No live session on a page: a browser is sent to the sign-in form."""


class Dashboard:
    """The dashboard's routes (an API resource: engine/http/resources/__init__.py), with the
    panels and pages the installed features registered (``hooks.dashboard_panels``)."""

    def __init__(self, runtime, access=None):
        self.runtime = runtime
        self.tokens = TokenStore(runtime.store)
        self.sessions = SessionStore(runtime.store, runtime.config.dashboard_session_ms)
        shown = runtime.hooks.dashboard_panels
        self.panels = [item for item in shown if isinstance(item, DashboardPanel)]
        self.pages = [item for item in shown if isinstance(item, DashboardPage)]
        # The navigation bar's entries after the dashboard's own: each tab links to its first page.
        self.tabs = {}
        for page in self.pages:
            self.tabs.setdefault(page.tab, PREFIX + page.path)
        self._templates = {}

    def routes(self):
        """(method, path, callback, uses_db) of every dashboard route."""
        return (
            ('GET', PREFIX, self.overview_page, True),
            ('GET', PREFIX + '/login', self.login_page, True),
            ('POST', PREFIX + '/login', self.login, True),
            ('POST', PREFIX + '/logout', self.logout, True),
            ('GET', PREFIX + '/jobs', self.jobs_page, True),
            ('GET', PREFIX + '/jobs/<job_id>', self.job_page, True),
            ('POST', PREFIX + '/jobs/<job_id>/cancel', self.cancel, True),
            ('POST', PREFIX + '/jobs/<job_id>/retry', self.retry, True),
            ('POST', PREFIX + '/retry-failed', self.retry_failed, True),
            ('GET', PREFIX + '/usage', self.usage_page, True),
            *(('GET', PREFIX + page.path, self._feature_page(page), True) for page in self.pages),
            ('GET', PREFIX + '/static/<name>', self.static, False),
        )

    def paths(self):
        return dashboard_paths(self.pages)

    def schemas(self):
        return {}  # pages and forms: HTML, and the common Error

    def security_schemes(self):
        return {'dashboardSession': {'type': 'apiKey', 'in': 'cookie', 'name': SESSION_COOKIE}}

    # -- pages
    def overview_page(self):
        return self._page('overview', 'Overview', pages.overview)

    def jobs_page(self):
        def values(runtime):
            params = _query()
            job_id = (params.get('jobId') or '').strip()
            if job_id:  # search by id: straight to the job
                return _redirect(_job_url(job_id))
            return pages.job_list(runtime, params)

        return self._page('jobs', 'Jobs', values)

    def job_page(self, job_id):
        return self._page('job', 'Job', lambda runtime: pages.job_detail(runtime, job_id))

    def usage_page(self):
        def values(runtime):
            return pages.usage(runtime, _query())

        return self._page('usage', 'Usage', values, live=False)

    def _feature_page(self, page):
        """The route of a feature's page (core.extension.DashboardPage)."""

        def show(**path_values):
            def values(runtime):
                return page.read(runtime, _query(), **path_values)

            return self._page(page.path, page.title, values, False, page.template, page.tab)

        return show

    def _page(self, name, title, read, live=True, template=None, tab=None):
        """A page, or only its live part (``?part=live``, what the script refreshes; pages with
        one have a ``NAME_live`` template). ``template``: a feature's page's own; the
        dashboard's pages are ``templates/NAME.tpl``."""
        template = template or _template(name)
        try:
            session_id, principal = self._signed_in()
            values = read(self.runtime)
            if not isinstance(values, bottle.HTTPResponse):
                values['panels'] = self._panels(name)
        except _SignIn:
            return self._to_sign_in()
        except AiJobError as exc:
            return self._error(exc)
        if isinstance(values, bottle.HTTPResponse):
            return values
        values.update(self._common(title, session_id, principal, tab))
        if live and _query().get('part') == 'live':
            body = self._render(_template(name + '_live'), values)
            headers = {'X-Dashboard-Part': 'live'}
            if values.get('terminal'):
                headers['X-Dashboard-Final'] = '1'  # nothing will change: stop refreshing
            return _html(body, headers=headers)
        return _html(self._render(template, values))

    def _panels(self, name):
        """The features' panels on page ``name``, rendered, for its template's panels' slot."""
        return [
            self._render(panel.template, panel.read(self.runtime, _query()))
            for panel in self.panels
            if panel.page == name
        ]

    def _common(self, title, session_id, principal, tab=None):
        notice = NOTICES.get(_query().get('notice') or '')
        if _query().get('notice') == 'bulk':
            notice = _bulk_notice(_query())
        return {
            'title': title,
            'user_id': principal.user_id,
            'csrf': csrf_token(session_id),
            'notice': notice,
            'refresh_ms': pages.LIVE_REFRESH_MS,
            'job_refresh_ms': pages.JOB_REFRESH_MS,
            'queue_names': QUEUE_NAMES,
            'tab': tab,
            'tabs': self.tabs,
        }

    # -- sign-in
    def login_page(self, status=200, message=None):
        if status == 200:
            try:
                self._signed_in()
                return _redirect(PREFIX)  # already signed in
            except _SignIn:
                pass
        nonce = _cookie(LOGIN_COOKIE)
        if not nonce or len(nonce) > 64:
            nonce = os.urandom(16).hex()
        values = {
            'title': 'Sign in',
            'login_csrf': nonce,
            'message': message,
            'notice': NOTICES.get(_query().get('notice') or ''),
        }
        response = _html(self._render(_template('login'), values), status)
        response.set_cookie(LOGIN_COOKIE, nonce, **self._cookie_options(max_age=3600))
        return response

    def login(self):
        try:
            self._same_origin()
            nonce = _cookie(LOGIN_COOKIE)
            if not nonce or bottle.request.forms.getunicode('csrf') != nonce:
                raise CsrfError()
        except AiJobError as exc:
            return self._error(exc)
        token = (bottle.request.forms.getunicode('token') or '').strip()
        principal = self.tokens.authenticate(token) if token else None
        if principal is None:
            log_event('dashboard.sign_in_refused', reason='unknown_token')
            return self.login_page(401, UnauthorizedError.public_message)
        if not principal.is_admin:
            log_event('dashboard.sign_in_refused', reason='not_admin', user_id=principal.user_id)
            return self.login_page(403, 'The dashboard is for SUPER_ADMIN tokens only.')
        session_id = self.sessions.open(principal, token)
        log_event('dashboard.signed_in', user_id=principal.user_id)
        response = _redirect(PREFIX)
        response.set_cookie(SESSION_COOKIE, session_id, **self._cookie_options())
        return response

    def logout(self):
        def act(session_id, principal):
            self.sessions.close(session_id)
            log_event('dashboard.signed_out', user_id=principal.user_id)
            response = _redirect(PREFIX + '/login?' + urlencode({'notice': 'signed_out'}))
            response.delete_cookie(SESSION_COOKIE, path=PREFIX)
            return response

        return self._action(act)

    # -- actions
    def cancel(self, job_id):
        def act(session_id, principal):
            job = self.runtime.service.cancel_job(_known_job(job_id))
            log_event('dashboard.cancel', job_id=job.id, user_id=principal.user_id)
            notice = 'cancel_requested' if job.lifecycle_status == RUNNING else 'cancelled'
            return _redirect(_job_url(job.id, notice=notice))

        return self._action(act)

    def retry(self, job_id):
        def act(session_id, principal):
            job = self.runtime.service.retry_job(_known_job(job_id))
            log_event(
                'dashboard.retry', job_id=job.id, retry_of_job_id=job_id, user_id=principal.user_id
            )
            return _redirect(_job_url(job.id, notice='retried'))

        return self._action(act)

    def retry_failed(self):
        def act(session_id, principal):
            form = bottle.request.forms
            job_type = form.getunicode('jobType') or ''
            self.runtime.registry.get(job_type)  # UNKNOWN_JOB_TYPE (400) otherwise
            since = pages.admin_jobs.parse_time(form.getunicode('since'), 'since')
            if since is None:
                raise InvalidRequestError('since is required', field='since')
            done = self.runtime.service.retry_failed(job_type, since)
            log_event(
                'dashboard.retry_failed',
                job_type=job_type,
                retried=len(done.new_jobs),
                skipped=done.skipped,
                refused=done.refused,
                user_id=principal.user_id,
            )
            query = {'jobType': job_type, 'notice': 'bulk', 'n': len(done.new_jobs)}
            query.update(skipped=done.skipped, refused=done.refused, more=int(done.more))
            return _redirect(PREFIX + '/jobs?' + urlencode(query))

        return self._action(act)

    def _action(self, act):
        """A POST of a signed-in operator: same origin, the session's CSRF token, then
        ``act(session_id, principal)``. Refused actions change nothing."""
        try:
            self._same_origin()
            session_id, principal = self._signed_in()
            if not csrf_ok(session_id, bottle.request.forms.getunicode('csrf')):
                log_event('dashboard.csrf_refused', user_id=principal.user_id)
                raise CsrfError()
            return act(session_id, principal)
        except _SignIn:
            return self._error(UnauthorizedError())
        except AiJobError as exc:
            return self._error(exc)

    # -- static files (vendored: nothing comes from another site)
    def static(self, name):
        if not _STATIC_NAME.match(name) or not os.path.isfile(os.path.join(STATIC, name)):
            return self._error(NoSuchEndpointError())
        with open(os.path.join(STATIC, name), 'rb') as source:
            body = source.read()
        headers = dict(SECURITY_HEADERS)
        headers['Content-Type'] = _STATIC_TYPES[name.rsplit('.', 1)[1]] + '; charset=utf-8'
        headers['Cache-Control'] = 'public, max-age=300'
        return bottle.HTTPResponse(body=body, status=200, headers=headers)

    # -- helpers
    def _signed_in(self):
        session_id = _cookie(SESSION_COOKIE)
        principal = self.sessions.find(session_id) if session_id else None
        if principal is None:
            raise _SignIn()
        bottle.request.environ['aijob.principal'] = principal
        return session_id, principal

    def _same_origin(self):
        """An action from a page of another site is refused, whatever it carries."""
        origin = bottle.request.get_header('Origin')
        if origin and urlsplit(origin).netloc != bottle.request.urlparts.netloc:
            log_event('dashboard.cross_origin_refused')
            raise CsrfError()

    def _cookie_options(self, max_age=None):
        options = {
            'path': PREFIX,
            'httponly': True,
            'samesite': 'strict',
            'secure': bottle.request.urlparts.scheme == 'https',
        }
        if max_age is None:
            max_age = self.runtime.config.dashboard_session_ms // 1000
        options['max_age'] = max_age
        return options

    def _to_sign_in(self):
        if _wants_html():
            return _redirect(PREFIX + '/login')
        return self._error(UnauthorizedError())

    def _error(self, exc):
        status = exc.http_status if exc.http_status < 500 or exc.http_status == 503 else 500
        code = exc.code if status != 500 else 'INTERNAL_ERROR'
        message = exc.public_message if status != 500 else 'Internal error.'
        if not _wants_html():
            body = json.dumps({'error': {'code': code, 'message': message}})
            headers = {'Content-Type': 'application/json', 'Cache-Control': 'no-store'}
            return bottle.HTTPResponse(body=body, status=status, headers=headers)
        values = {'title': 'Error', 'code': code, 'message': message, 'status': status}
        return _html(self._render(_template('error'), values), status)

    def _render(self, path, values):
        """The template at ``path`` rendered with ``values`` and the helpers; a feature's
        template finds the dashboard's (``rebase('base')``) after its own folder's."""
        template = self._templates.get(path)
        if template is None:
            folder, file_name = os.path.split(path)
            name = os.path.splitext(file_name)[0]
            template = bottle.SimpleTemplate(name=name, lookup=[folder, TEMPLATES])
            self._templates[path] = template
        helpers = {
            'when': pages.when,
            'duration': pages.duration,
            'seconds': pages.seconds,
            'input_value': pages.input_value,
            'pretty': pages.pretty,
            'job_url': _job_url,
            'urlencode': urlencode,
            'prefix': PREFIX,
        }
        return template.render(dict(helpers, **values))


def _template(name):
    return os.path.join(TEMPLATES, name + '.tpl')


def _query():
    return {name: bottle.request.query.getunicode(name) for name in bottle.request.query}


def _wants_html():
    return 'text/html' in (bottle.request.get_header('Accept') or '')


def _html(body, status=200, headers=None):
    all_headers = dict(SECURITY_HEADERS, **{'Content-Type': 'text/html; charset=utf-8'})
    all_headers.update(headers or {})
    return bottle.HTTPResponse(body=body.encode('utf-8'), status=status, headers=all_headers)


def _cookie(name):
    """The request's cookie ``name``, or None. A Cookie header the standard parser refuses (a
    name with a character it does not allow, from any other site's cookie on this host) is read
    leniently instead, pair by pair: one bad cookie must not make the dashboard fail."""
    try:
        return bottle.request.get_cookie(name)
    except http.cookies.CookieError:
        pass
    for pair in bottle.request.get_header('Cookie', '').split(';'):
        key, _, value = pair.partition('=')
        if key.strip() == name:
            return value.strip().strip('"') or None
    return None


def _redirect(location):
    return bottle.HTTPResponse(status=303, headers=dict(SECURITY_HEADERS, Location=location))


def _job_url(job_id, **query):
    url = '%s/jobs/%s' % (PREFIX, quote(job_id, safe=''))
    return url + ('?' + urlencode(query) if query else '')


def _known_job(job_id):
    if not _JOB_ID.match(job_id):
        raise JobNotFoundError(job_id)
    return job_id


def _bulk_notice(query):
    def number(name):
        return pages.admin_jobs.whole_number(query.get(name) or '0', 0, 10**9) or 0

    text = 'Retried %d failed jobs' % number('n')
    if number('skipped'):
        text += '; %d skipped (their input was purged)' % number('skipped')
    if number('refused'):
        text += "; %d refused by their users' limits" % number('refused')
    if number('more'):
        text += '; more remain: run it again'
    return text + '.'
