"""A one-provider route whose provider is down a while, then back (issue 31 item 5), shared by
tests/features/gateway/test_gateway_fallback.py (in the process, both backend pairs) and
tests/features/gateway/test_gateway_processes.py (two worker processes): its settings (a
cooldown of a minute, a probe every PROBE_MS), the outage on a FakeOpenAI, and the wait for
every job's success within the outage, one probe interval and a second."""

import json
import threading
import time

from engine.core.models import AiJob, AiUsageLog
from tests.support.fake_openai import error_reply, json_reply
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import FAST_SETTINGS

OUTAGE_S, PROBE_MS, LONG_COOLDOWN_MS = 5.0, 2000, 60000
RECOVERY_JOBS = 6


def one_provider(fake):
    return json.dumps(
        {
            'providers': {
                'a': {'baseUrl': fake.base_url, 'apiKeyEnv': 'TEST_KEY_A', 'models': {'m': {}}}
            },
            'routes': {'default': ['a/m']},
        }
    )


def recovery_settings(fake):
    """A one-provider route whose entry cools for a minute after 3 failures, probed every
    PROBE_MS."""
    return dict(
        FAST_SETTINGS,
        AIJOB_PROVIDERS=one_provider(fake),
        TEST_KEY_A='sk-provider-a-51f0c9d2',
        AIJOB_COOLDOWN_FAILURES='3',
        AIJOB_COOLDOWN_WINDOW_MS='60000',
        AIJOB_COOLDOWN_MS=str(LONG_COOLDOWN_MS),
        AIJOB_COOLDOWN_PROBE_MS=str(PROBE_MS),
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )


def outage(fake):
    """The provider answers 503 from now for OUTAGE_S, then answers again: returns the start and
    the timer that brings it back."""
    fake.script(error_reply(503, 'upstream down'))
    back = threading.Timer(OUTAGE_S, fake.script, args=(json_reply({'ok': True}),))
    started = time.monotonic()
    back.start()
    return started, back


def wait_recovered(jobs, started):
    """Every job succeeded within the outage, one probe interval and a second (the cooldown,
    60 s, would be unmistakable); returns the seconds from the outage's start to the last."""
    deadline = started + OUTAGE_S + PROBE_MS / 1000.0 + 1.0

    def succeeded():
        statuses = [AiJob.get_by_id(job.id).lifecycle_status for job in jobs]
        return statuses == ['succeeded'] * len(jobs)

    wait_until(succeeded, timeout=max(0.0, deadline - time.monotonic()), interval=0.05)
    return time.monotonic() - started


def probes_during(fake, started):
    """The calls ``fake`` received during the outage from one probe interval after its first:
    the threshold's calls and any already in flight all came before the cooldown began, and
    none of them can come that late, so these are the probes (claimed no sooner than an
    interval after the cooldown began, and an interval apart)."""
    arrivals = sorted(fake.answered_at)
    first = arrivals[0]
    ended = started + OUTAGE_S
    return sum(1 for t in arrivals if first + PROBE_MS / 1000.0 <= t < ended)


def allowed_probes():
    """One probe per interval during the outage."""
    return int(OUTAGE_S * 1000 // PROBE_MS)


def recover_through_outage(rt, fake, where):
    """The scenario both tests run, with ``rt``'s jobs run ``where`` (a phrase for the printed
    figures): the provider goes down, RECOVERY_JOBS jobs of type ``routed`` are created, each
    succeeds within the outage, one probe interval and a second, the probe's success ends the
    cooldown for every process, and the outage cost at most one probe per interval."""
    with rt.store.connection():
        started, back = outage(fake)
        jobs = [create_job(rt, job_type='routed', user_id='u%d' % i) for i in range(RECOVERY_JOBS)]
        elapsed = wait_recovered(jobs, started)
        back.join()
        failed = AiUsageLog.select().where(AiUsageLog.error_code.is_null(False)).count()
        assert rt.ai.gateway.cooldown_state() == {'a/m': 0}  # the probe ended it, for all
    probes = probes_during(fake, started)
    print(
        'one-provider route %s, down %.0f s, probe every %d ms, cooldown %d ms: %d jobs '
        'succeeded by %.1f s; %d failed calls, %d of them probes'
        % (where, OUTAGE_S, PROBE_MS, LONG_COOLDOWN_MS, len(jobs), elapsed, failed, probes)
    )
    # The outage cost the threshold's calls plus at most one probe per interval, whichever
    # worker claimed it.
    assert probes <= allowed_probes()
