"""The rate-limit run shared by tests/features/rate_limits/test_ratelimit_processes.py and
benchmarks/ratelimit_rate.py: a fake provider that answers 429 beyond ``limit`` requests in any
``window_s``, the workers' settings that hold that limit in Redis, and the
flashcard jobs they run. Usable outside pytest (the benchmark imports it)."""

from tests.support.fake_openai import json_reply
from tests.support.helpers import create_job
from tests.support.provider_configs import one_provider
from tests.support.runtimes import FAST_SETTINGS

CARDS = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}]}
USERS = 7


def limit_fake(fake, limit, window_s):
    """Script ``fake`` (a started FakeOpenAI) to answer every call with CARDS, and 429 beyond
    ``limit`` requests in any ``window_s``."""
    fake.script(json_reply(CARDS))
    fake.limit_rate(limit, window_s)
    return fake


def settings(base_url, limit, window_s):
    """The workers' environment (raw strings, the backend's URLs and prefix aside): fast
    intervals, the fake as the platform provider, its model limited to ``limit`` requests per
    ``window_s``, no per-user caps."""
    # The outbox claims keep their default TTL: a wake-up stays its own process's to push.
    fast = {k: v for k, v in FAST_SETTINGS.items() if k != 'AIJOB_OUTBOX_LOCK_TTL_MS'}
    return dict(
        fast,
        AIJOB_PLATFORM_API_KEY='sk-platform-ratelimit-7f3a',
        **one_provider(base_url, limits={'rpm': limit}),
        AIJOB_RATE_LIMIT_WINDOW_MS=str(int(window_s * 1000)),
        AIJOB_INTERACTIVE_CONCURRENCY='4',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )


def create_jobs(runtime, count):
    """``count`` flashcard jobs of USERS users, each with its own input (no two alike); a
    connection must be open."""
    for i in range(count):
        create_job(
            runtime,
            job_type='flashcard_generation',
            user_id='u%d' % (i % USERS),
            target_id='note-%d' % i,
            input={'text': 'Paris is in France. %d' % i},
        )
