"""The dashboard's part of the OpenAPI document: HTML pages and form posts for a browser, listed so
that every route of the app is documented. Errors are the usual JSON unless the caller accepts
text/html, which gets the same code and status as a page."""

from .openapi import error_responses, json_response, ref

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


def dashboard_paths():
    prefix = '/dashboard'
    return {
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
        prefix + '/batches': _page(
            'Provider batches (state, provider status, counts, age, cost) and the jobs waiting '
            'for one; ``state`` and ``cursor`` filter and page the list.'
        ),
        prefix + '/batches/{batchId}': _page(
            'One provider batch and its jobs.',
            404,
            parameters=[
                {'name': 'batchId', 'in': 'path', 'required': True, 'schema': {'type': 'string'}}
            ],
        ),
        prefix + '/static/{name}': {
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
        },
    }


def _with_job_id(item):
    item['post']['parameters'] = [_job_id()]
    return item
