"""A job-type plugin for tests with real worker processes (AIJOB_DEFINITIONS=
tests.support.background_jobs): the synthetic job on the ai-background queue, so a batch spans
both queues."""

from engine.jobtypes.synthetic import synthetic_definition


def register(app):
    app.add_job_type(synthetic_definition(job_type='synthetic_bg', queue_name='ai-background'))
