"""The HTTP API (contracts §7) as a bottle app, built from its resources' route tables.

Each resource (engine/http/resources/) declares its routes, its part of the OpenAPI document
(``paths()``) and the schemas it owns (``schemas()``); the order of ``Api.resources`` is the
order of the document's paths. Every route runs inside the Guard (guard.py), which turns an
error into its public JSON body; every path also answers OPTIONS with the methods the document
lists for it.
"""

import re

import bottle

from .access import Access
from .cors import Cors
from .guard import Guard, bottle_error
from .openapi import allowed_methods, build_document
from .resources.admin_jobs import AdminJobs
from .resources.credentials import Credentials
from .resources.jobs import Jobs
from .resources.operations import Operations
from .resources.tokens import Tokens
from .resources.usage import Usage


class Api:
    """The resources of one app over one runtime, and the document built from them. The server
    reaches the long poll's watch through it (to end waits when it stops)."""

    def __init__(self, runtime):
        access = Access(runtime)
        jobs = Jobs(runtime, access)
        self.watch = jobs.watch
        # The kernel's resources, then the installed features' (in the extensions' order).
        self.resources = (
            jobs,
            AdminJobs(runtime, access),
            Credentials(runtime, access),
            Usage(runtime, access),
            Operations(runtime, self.document),
            Tokens(runtime, access),
        ) + tuple(make(runtime, access) for make in runtime.hooks.http_resources)
        self.openapi = build_document(self.resources)

    def document(self):
        return self.openapi

    def routes(self):
        """(method, path, callback, uses_db) of every resource, in their order."""
        return tuple(route for resource in self.resources for route in resource.routes())


def create_app(runtime):
    """The WSGI application for ``runtime``."""
    api = Api(runtime)
    app = bottle.Bottle(catchall=True)
    cors = Cors(runtime.config.cors_origins)
    app.install(cors)  # first: outside the Guard, whose error answers get its headers too
    app.install(Guard(runtime.store, runtime.config.request_timeout_ms / 1000.0, runtime.signals))
    app.default_error_handler = bottle_error
    app.aijob_api = api
    routes = api.routes()
    for method, path, callback, uses_db in routes:
        app.route(path, method, callback, db=uses_db)
    for path, allow in _allow_headers(api.openapi, routes).items():
        app.route(path, 'OPTIONS', _options(path, allow, cors), db=False)
    return app


def _allow_headers(document, routes):
    """{bottle route path: its Allow header}, from the document, whose paths these are."""
    allow = {}
    for _, path, _, _ in routes:
        template = re.sub(r'<(\w+)(:[^>]*)?>', lambda m: '{%s}' % _camel(m.group(1)), path)
        operations = document['paths'].get(template)
        if operations is not None:
            allow[path] = allowed_methods(operations)
    return allow


def _camel(name):
    head, *rest = name.split('_')
    return head + ''.join(part.title() for part in rest)


def _options(path, allow, cors):
    def options(**path_parameters):
        headers = dict(cors.preflight_headers(path, allow), Allow=allow)
        return bottle.HTTPResponse(status=204, headers=headers)

    return options
