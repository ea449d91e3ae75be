"""The features: one folder each, holding all of the feature (its settings, tables, call guard,
leader and purge steps, HTTP routes and OpenAPI fragment, dashboard panel) and its
``Extension``. A feature's ``__init__`` says which other features it imports (``USES``); the
kernel imports none (tests/project/test_layout.py). Deleting a feature's folder and its line in
engine/extensions.py leaves a working engine."""
