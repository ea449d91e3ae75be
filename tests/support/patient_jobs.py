"""A job-type plugin for worker processes (AIJOB_DEFINITIONS=tests.support.patient_jobs):
``routed``, as tests.support.routed_jobs has it but with ten retries, for a provider that stays
down a while (each failed probe of a cooling entry spends the retry of the job that made it)."""

from tests.support.routed_jobs import routed_definition


def register(app):
    app.add_job_type(routed_definition(max_retries=10))
