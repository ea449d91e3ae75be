"""Cooldowns shared by every worker process (issue 21 item 3), with three real ``python aijob.py
worker`` processes on MariaDB + Redis: while the first provider of the route is down (it answers
503 to everything), the calls it receives in total during one cooldown are at most the failure
threshold, and every job succeeds on the second provider."""

import json

import pytest

from engine.core.models import AiJobEvent, AiUsageLog
from tests.support.fake_openai import FakeOpenAI, error_reply, json_reply
from tests.support.helpers import create_job
from tests.support.routed_jobs import routed_definition
from tests.support.runtimes import FAST_SETTINGS, fast_registry, wait_terminal

pytestmark = pytest.mark.slow

THRESHOLD = 3
JOBS = 30


@pytest.fixture
def two_providers():
    down, healthy = FakeOpenAI().start(), FakeOpenAI().start()
    down.script(error_reply(503, 'upstream down'))
    healthy.script(json_reply({'ok': True}))
    yield down, healthy
    down.stop()
    healthy.stop()


def test_three_workers_send_a_down_provider_at_most_the_threshold_during_one_cooldown(
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
        AIJOB_DEFINITIONS='tests.support.routed_jobs',
        AIJOB_INTERACTIVE_CONCURRENCY='1',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )
    rt = make_runtime(registry=fast_registry(routed_definition()), **settings)
    workers = [spawn(backend.env(**settings)) for _ in range(3)]
    with rt.store.connection():
        jobs = [create_job(rt, job_type='routed', user_id='u%d' % i) for i in range(JOBS)]
        done = [wait_terminal(rt, job.id, timeout=60) for job in jobs]
        assert [job.lifecycle_status for job in done] == ['succeeded'] * JOBS
        calls_to_down = AiUsageLog.select().where(AiUsageLog.provider == 'a').count()
        answered = AiUsageLog.select().where(
            (AiUsageLog.provider == 'b') & AiUsageLog.error_code.is_null()
        )
        fallbacks = list(AiJobEvent.select().where(AiJobEvent.kind == 'fallback'))
        cooling = rt.ai.gateway.cooldown_state()['a/model-a']
    print(
        'down provider: %d calls received for %d jobs on 3 workers (threshold %d); '
        'cooldown left %.1f s' % (len(down.requests), JOBS, THRESHOLD, cooling)
    )
    assert len(down.requests) <= THRESHOLD
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
