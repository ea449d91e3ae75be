"""A job-type plugin for provider batch tests, in this process and in worker processes
(AIJOB_DEFINITIONS=tests.support.batched_jobs): ``batched`` runs on ai-background on the default
route of AIJOB_PROVIDERS, opts in to provider batches and keeps any JSON object it gets;
``provider_settings`` is the provider file of one fake that serves both paths."""

import dataclasses
import json

from engine.core.registry import BatchPolicy, QueuePolicy
from tests.support.routed_jobs import routed_definition

KEY_ENV = 'TEST_BATCH_KEY'
# Per 1000 tokens, so the fake's line usage (11 prompt, 7 completion) costs 0.025 online.
PRICE = {'prompt': '1', 'completion': '2', 'per': 1000}
FAST_BATCHES = {
    'AIJOB_BATCH_INTERVAL_MS': '50',
    'AIJOB_BATCH_POLL_FIRST_MS': '50',
    'AIJOB_BATCH_POLL_MAX_MS': '200',
    'AIJOB_MAX_ACTIVE_JOBS_PER_USER': '1000',  # hundreds of jobs wait in batches at once
    'AIJOB_DAILY_JOB_QUOTA': '100000',
}


def batched_definition(job_type='batched', max_wait_ms=300, max_jobs=10, max_retries=2):
    base = routed_definition(job_type=job_type, max_retries=max_retries)
    return dataclasses.replace(
        base,
        queue=QueuePolicy('ai-background'),
        batch=BatchPolicy(max_wait_ms=max_wait_ms, max_jobs=max_jobs),
    )


def provider_settings(base_url, model='fake-model', **extra):
    """The settings of a runtime whose one provider (``fake``, its key in TEST_BATCH_KEY) is the
    fake at ``base_url``, priced PRICE (batch: the default half)."""
    providers = {
        'providers': {
            'fake': {
                'baseUrl': base_url,
                'apiKeyEnv': KEY_ENV,
                'models': {model: {'price': PRICE}},
            }
        }
    }
    return dict(AIJOB_PROVIDERS=json.dumps(providers), **{KEY_ENV: 'sk-batch-test'}, **extra)


def register(app):
    # Worker processes: a batch of exactly ten jobs (the tests create ten, and no batch forms
    # before they all wait).
    app.add_job_type(batched_definition(max_wait_ms=60_000, max_jobs=10))
