"""The dashboard's part of the OpenAPI document: HTML pages and form posts for a browser, listed so
that every route of the app is documented. Errors are the usual JSON unless the caller accepts
text/html, which gets the same code and status as a page."""

import re

from ...http.openapi import error_responses, json_response, ref

_HTML = {'text/html': {'schema': {'type': 'string'}}}
# An error: a page for a browser, the usual JSON error for any other client.
_ERROR_PAGE = dict(_HTML, **{'application/json': {'schema': ref('Error')}})
_SESSION = [{'dashboardSession': []}]
_FORM = 'application/x-www-form-urlencoded'


def _page(summary, *errors, parameters=()):
    operation = {
        'summary': summary,
        'tags': ['dashboard'],
        'security': _SESSION,
        'responses': dict(
            {
                '200': {'description': 'The page (?part=live: its live part).', 'content': _HTML},
                '303': {'description': 'Not signed in: to the sign-in form.'},
            },
            **error_responses(401, 503, *errors),
        ),
    }
    if parameters:
        operation['parameters'] = list(parameters)
    return {'get': operation}


def _action(summary, *errors):
    return {
        'post': {
            'summary': summary + " Form fields: ``csrf`` (the session's token) and the action's.",
            'tags': ['dashboard'],
            'security': _SESSION,
            'requestBody': {'content': {_FORM: {'schema': {'type': 'object'}}}},
            'responses': dict(
                {'303': {'description': 'Done: to the page that shows the result.'}},
                **error_responses(401, 403, 503, *errors),
            ),
        }
    }


def _job_id():
    return {'name': 'jobId', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}


def dashboard_paths(pages=()):
    """The dashboard's paths, with the pages of features (core.extension.DashboardPage) before
    its static files."""
    prefix = '/dashboard'
    paths = {
        prefix: _page('Overview: jobs by state and queue, outbox, workers, throughput.'),
        prefix + '/login': {
            'get': {
                'summary': 'The sign-in form.',
                'tags': ['dashboard'],
                'security': [],
                'responses': dict(
                    {'200': {'description': 'The form.', 'content': _HTML}}, **error_responses()
                ),
            },
            'post': {
                'summary': 'Exchange an admin token (form field ``token``) for a session cookie '
                '(HttpOnly, SameSite=Strict).',
                'tags': ['dashboard'],
                'security': [],
                'responses': dict(
                    {
                        '303': {'description': 'Signed in: to the overview.'},
                        '401': {
                            'description': 'Unknown or revoked token.',
                            'content': _ERROR_PAGE,
                        },
                        '403': {
                            'description': 'A user token (or CSRF_TOKEN_INVALID).',
                            'content': _ERROR_PAGE,
                        },
                    },
                    **error_responses(),
                ),
            },
        },
        prefix + '/logout': _action('Sign out: the session ends.'),
        prefix + '/jobs': _page('The job list with filters and keyset pages.', 400),
        prefix + '/jobs/{jobId}': _page(
            'One job: status, timeline, error, artifacts, usage.', 404, parameters=[_job_id()]
        ),
        prefix + '/jobs/{jobId}/cancel': _with_job_id(
            _action('Cancel a job (as its owner would).', 404, 409)
        ),
        prefix + '/jobs/{jobId}/retry': _with_job_id(
            _action('Retry a failed or cancelled job as a new job.', 404, 409, 429)
        ),
        prefix + '/retry-failed': _action(
            'Retry every failed job of ``jobType`` that finished since ``since``.', 400, 429
        ),
        prefix + '/usage': _page('Usage totals by user and by job type.'),
    }
    paths.update(_feature_page(prefix, page) for page in pages)
    paths[prefix + '/static/{name}'] = {
        'get': {
            'summary': "The dashboard's stylesheet, script and icon.",
            'tags': ['dashboard'],
            'security': [],
            'parameters': [
                {'name': 'name', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}
            ],
            'responses': dict(
                {
                    '200': {'description': 'The file.'},
                    '404': json_response('NOT_FOUND: no such file.', ref('Error')),
                },
                **error_responses(),
            ),
        }
    }
    return paths


def _feature_page(prefix, page):
    """(document path, its item) of a feature's page; a ``<batch_id>`` of its path is the
    document's ``{batchId}``, a string."""
    names = [_camel(name) for name in re.findall(r'<(\w+)>', page.path)]
    path = re.sub(r'<(\w+)>', lambda match: '{%s}' % _camel(match.group(1)), page.path)
    parameters = [
        {'name': name, 'in': 'path', 'required': True, 'schema': {'type': 'string'}}
        for name in names
    ]
    return prefix + path, _page(page.summary, *page.errors, parameters=parameters)


def _camel(name):
    head, *rest = name.split('_')
    return head + ''.join(part.title() for part in rest)


def _with_job_id(item):
    item['post']['parameters'] = [_job_id()]
    return item
