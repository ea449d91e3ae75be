"""The API's resources, one module each. A resource is built from the runtime (and the request's
``Access``) and declares three things, which the app and the OpenAPI document are built from
(app.py, openapi.py):

- ``routes()``: ``(method, bottle path, callback, uses_db)`` of each of its routes;
- ``paths()``: its part of the document's ``paths``, every route of it and nothing else;
- ``schemas()``: the component schemas it owns (the common ones are in openapi.py);
- optionally ``security_schemes()``: the document's security schemes it adds to bearerAuth.

Its checks of what a client sends and the shapes it answers live with it, so that a resource
moves as a unit."""
