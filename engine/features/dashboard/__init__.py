"""The operators' dashboard at ``/dashboard``: sign-in for an admin token (sessions.py, its table
in models.py and schema.sql), the server-rendered pages and form posts (routes.py), what each page
shows (pages.py, overview.py), its OpenAPI fragment (openapi.py), its templates and static files.
Other features add panels and pages to it through the ``dashboard_panels`` hook point, so it
imports none of them."""

USES = ()
