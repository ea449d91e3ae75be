"""``synthetic_cached``: the synthetic job type with the response cache on (scope ``user``), what
``python aijob.py bench --gateway`` runs to measure every guard of the gateway at once. Not a
built-in: it is loaded only where AIJOB_DEFINITIONS names this module."""

import dataclasses

from ..core.registry import CachePolicy
from .synthetic import synthetic_definition

CACHED_JOB_TYPE = 'synthetic_cached'


def register(app):
    definition = synthetic_definition(job_type=CACHED_JOB_TYPE)
    app.add_job_type(dataclasses.replace(definition, cache=CachePolicy(ttl_ms=600_000)))
