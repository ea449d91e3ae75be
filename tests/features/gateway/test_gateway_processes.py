"""Cooldowns shared by every worker process (issue 21 item 3, issue 31 item 5), with real
``python aijob.py worker`` processes on MariaDB + Redis: while the first provider of the route is
down (it answers 503 to everything), the calls it receives in total are at most the failure
threshold plus one probe per probe interval, and every job succeeds on the second provider; a
one-provider route whose provider comes back is used again within a probe interval."""

import json
import time

import pytest

from engine.core.models import AiJobEvent, AiUsageLog
from tests.support.fake_openai import FakeOpenAI, error_reply, json_reply
from tests.support.helpers import create_job
from tests.support.provider_outage import recover_through_outage, recovery_settings
from tests.support.routed_jobs import routed_definition
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

pytestmark = pytest.mark.slow

THRESHOLD = 3
JOBS = 30
DOWN_PROBE_MS = 2000


@pytest.fixture
def two_providers():
    down, healthy = FakeOpenAI().start(), FakeOpenAI().start()
    down.script(error_reply(503, 'upstream down'))
    healthy.script(json_reply({'ok': True}))
    yield down, healthy
    down.stop()
    healthy.stop()


def test_three_workers_send_a_down_provider_at_most_the_threshold_and_a_probe_per_interval(
    make_runtime, backend, spawn, two_providers
):
    if backend.redis_url is None:
        pytest.skip('worker processes share their state through Redis')
    down, healthy = two_providers
    settings = dict(
        FAST_SETTINGS,
        AIJOB_PROVIDERS=json.dumps(
            {
                'providers': {
                    'a': {
                        'baseUrl': down.base_url,
                        'apiKeyEnv': 'TEST_KEY_A',
                        'models': {'model-a': {}},
                    },
                    'b': {
                        'baseUrl': healthy.base_url,
                        'apiKeyEnv': 'TEST_KEY_B',
                        'models': {'model-b': {}},
                    },
                },
                'routes': {'default': ['a/model-a', 'b/model-b']},
            }
        ),
        TEST_KEY_A='sk-a-000000000000',
        TEST_KEY_B='sk-b-000000000000',
        AIJOB_COOLDOWN_FAILURES=str(THRESHOLD),
        AIJOB_COOLDOWN_WINDOW_MS='60000',
        AIJOB_COOLDOWN_MS='60000',  # longer than the test: everything below is one cooldown
        AIJOB_COOLDOWN_PROBE_MS=str(DOWN_PROBE_MS),
        AIJOB_DEFINITIONS='tests.support.routed_jobs',
        AIJOB_INTERACTIVE_CONCURRENCY='1',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )
    rt = make_runtime(registry=fast_registry(routed_definition()), **settings)
    workers = [spawn(backend.env(**settings)) for _ in range(3)]
    with rt.store.connection():
        started = time.monotonic()
        jobs = [create_job(rt, job_type='routed', user_id='u%d' % i) for i in range(JOBS)]
        done = [wait_terminal(rt, job.id, timeout=60) for job in jobs]
        # the probes the cooldown allowed, one per interval since the first call at the most
        probes = int((time.monotonic() - started) * 1000 // DOWN_PROBE_MS)
        assert [job.lifecycle_status for job in done] == ['succeeded'] * JOBS
        calls_to_down = AiUsageLog.select().where(AiUsageLog.provider == 'a').count()
        answered = AiUsageLog.select().where(
            (AiUsageLog.provider == 'b') & AiUsageLog.error_code.is_null()
        )
        fallbacks = list(AiJobEvent.select().where(AiJobEvent.kind == 'fallback'))
        cooling = rt.ai.gateway.cooldown_state()['a/model-a']
    print(
        'down provider: %d calls received for %d jobs on 3 workers (threshold %d, %d probes '
        'allowed); cooldown left %.1f s' % (len(down.requests), JOBS, THRESHOLD, probes, cooling)
    )
    assert len(down.requests) <= THRESHOLD + probes
    assert calls_to_down == len(down.requests)  # each call it received has its usage row
    assert answered.count() == JOBS and len(healthy.requests) == JOBS
    assert len(fallbacks) == JOBS  # every job went past the down entry, by a failure or a skip
    assert {e.detail['errorCode'] for e in fallbacks} <= {
        'PROVIDER_UNAVAILABLE',
        'PROVIDER_COOLDOWN',
    }
    # The state is the workers' shared one: this process reads the cooldown they started.
    assert cooling > 0
    assert sum(len(w.events('gateway.cooldown')) for w in workers) >= 1
    assert all(w.proc.poll() is None for w in workers)  # none crashed on the way


@pytest.mark.parametrize('backend', ['mysql+redis'], indirect=True)
def test_two_workers_use_a_one_provider_route_again_within_a_probe_interval_of_its_recovery(
    make_runtime, backend, spawn
):
    fake = FakeOpenAI().start()
    try:
        settings = dict(
            recovery_settings(fake),
            AIJOB_DEFINITIONS='tests.support.patient_jobs',
            AIJOB_INTERACTIVE_CONCURRENCY='2',
        )
        rt = make_runtime(registry=fast_registry(routed_definition(max_retries=10)), **settings)
        workers = [spawn(backend.env(**settings)) for _ in range(2)]
        recover_through_outage(rt, fake, 'over 2 workers')
        assert all(w.proc.poll() is None for w in workers)
    finally:
        fake.stop()
