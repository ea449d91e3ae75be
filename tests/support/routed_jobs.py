"""A job-type plugin for gateway tests, in this process and in worker processes
(AIJOB_DEFINITIONS=tests.support.routed_jobs): ``routed`` runs on the default route of
AIJOB_PROVIDERS with the generic prompt, retries fast, and keeps any JSON object it gets."""

import dataclasses

from engine.jobtypes.synthetic import synthetic_definition


def routed_definition(job_type='routed', max_retries=2, route=None):
    base = synthetic_definition(
        job_type=job_type, timeout_ms=10_000, max_retries=max_retries, backoff_ms=20
    )
    return dataclasses.replace(base, provider=None, route=route)


def register(app):
    app.add_job_type(routed_definition())
