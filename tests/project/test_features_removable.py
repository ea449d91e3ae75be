"""Deleting a feature's folder and its line in engine/extensions.py leaves a working engine
(issue 32): for every installed feature, a runtime without it, and without the features whose
``USES`` names it (they would not import any more), creates its schema, serves its API and runs a
job to ``succeeded``; and so does the kernel alone, with no feature at all."""

import ast

import pytest

from engine.extensions import INSTALLED
from tests.support.api import Harness
from tests.support.backends import reset_tables
from tests.support.paths import ROOT
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

pytestmark = pytest.mark.slow


def uses(name):
    """The features engine/features/<name>/__init__.py says it imports."""
    tree = ast.parse(open('%s/engine/features/%s/__init__.py' % (ROOT, name)).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ['USES']:
            return set(ast.literal_eval(node.value))
    return set()


def without(name):
    """INSTALLED less ``name`` and every feature that imports it, directly or not."""
    gone = {name}
    while True:
        more = {e.name for e in INSTALLED if uses(e.name) & gone} - gone
        if not more:
            return tuple(e for e in INSTALLED if e.name not in gone)
        gone |= more


def run_one_job(backend, extensions):
    from engine.runtime import Runtime

    runtime = Runtime(
        backend.config(**FAST_SETTINGS), registry=fast_registry(), extensions=extensions
    )
    try:
        runtime.create_schema()
        reset_tables(runtime)
        with runtime.store.connection():
            api = Harness(runtime)
            assert api.anon.get('/openapi.json').status == 200
            job_id = api.create()
        runtime.start_background()
        with runtime.store.connection():
            assert wait_terminal(runtime, job_id).lifecycle_status == 'succeeded'
            assert api.a.get('/api/ai/jobs/%s' % job_id).json['lifecycleStatus'] == 'succeeded'
        return runtime.features
    finally:
        runtime.close()


@pytest.mark.parametrize('name', [extension.name for extension in INSTALLED])
def test_the_engine_runs_without_each_feature(backend, name):
    features = run_one_job(backend, without(name))
    assert name not in features


def test_the_kernel_alone_runs_a_job(backend):
    assert run_one_job(backend, ()) == {}
