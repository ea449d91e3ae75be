"""One suite, run against every backend pair (docs/architecture.md, "Tests").

The fixtures live in tests/support/, one module per kind (see tests/support/__init__.py).
"""

pytest_plugins = (
    'tests.support.backends',
    'tests.support.runtimes',
    'tests.support.api',
    'tests.support.fake_openai',
    'tests.support.fake_batch_api',
    'tests.support.receiver',
    'tests.support.dashboard',
    'tests.support.worker_processes',
)
