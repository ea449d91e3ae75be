"""What the response cache costs and saves (README "The response cache"): N synthetic jobs run
by an in-process worker, in three ways that alternate round by round:

- ``plain``: the synthetic definition, no cache policy (no guard at all);
- ``hits``: the same definition with ``CachePolicy(scope='global')`` and one input for every job,
  so all but the first are answered from the cache (a lookup, the ``cache_hit`` event, a usage
  row at cost 0);
- ``misses``: the cached definition with a distinct input per job (a lookup, a claim, the
  provider, the entry written with the success).

The synthetic provider costs nothing, so ``hits`` and ``misses`` show the cache's own overhead:
a real provider call of seconds is what a hit saves. Prints jobs/s and this process's CPU ms per
job (CPU time: other processes' load on a shared machine does not count), medians of the rounds.

    python benchmarks/cache_hits.py [--jobs 1000] [--rounds 3] [--database-url sqlite:///…]
"""

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.models import AiJob  # noqa: E402
from engine.core.registry import CachePolicy, JobDefinitionRegistry  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
from engine.core.states import TERMINAL  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.jobtypes.synthetic import synthetic_definition  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

KINDS = ('plain', 'hits', 'misses')
USERS = 50


def registry(kind):
    definition = synthetic_definition()
    if kind != 'plain':
        definition = dataclasses.replace(definition, cache=CachePolicy(600_000, 'global'))
    chosen = JobDefinitionRegistry()
    chosen.register(definition)
    return chosen


def run(kind, jobs, database_url):
    """(jobs/s, CPU ms per job) of one round of ``kind``."""
    config = load_config(
        {
            'AIJOB_DATABASE_URL': database_url,
            'AIJOB_MAX_ACTIVE_JOBS_PER_USER': '0',
            'AIJOB_DAILY_JOB_QUOTA': '0',
        }
    )
    runtime = Runtime(config, role='bench', registry=registry(kind))
    runtime.create_schema()
    with runtime.store.connection():
        for model in runtime.models:  # every round starts from empty tables (and an empty cache)
            model.delete().execute()
        runtime.start_background()
        try:
            started, cpu = time.monotonic(), time.process_time()
            ids = [runtime.service.create_job(job_input(kind, i)).job.id for i in range(jobs)]
            wait_terminal(ids)
            wall, cpu = time.monotonic() - started, time.process_time() - cpu
        finally:
            runtime.stop_background(timeout_s=10)
        done = AiJob.select().where(AiJob.lifecycle_status == 'succeeded').count()
    runtime.close()
    assert done == jobs, '%s: %d of %d succeeded' % (kind, done, jobs)
    return jobs / wall, cpu * 1000.0 / jobs


def job_input(kind, i):
    output = {'n': i if kind == 'misses' else 0}
    return CreateJobInput(
        user_id='user-%d' % (i % USERS),
        job_type='synthetic',
        target_type='note',
        target_id='n%d' % i,
        input={'output': output},
    )


def wait_terminal(ids, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = AiJob.select().where(AiJob.id.in_(ids) & AiJob.lifecycle_status.not_in(TERMINAL))
        if not left.count():
            return
        time.sleep(0.05)
    raise RuntimeError('jobs still running after %d s' % timeout_s)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--jobs', type=int, default=1000)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--database-url', help='default: a SQLite file in a temporary directory')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.database_url or 'sqlite:///%s' % os.path.join(folder, 'cache-bench.db')
        figures = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                figures[kind].append(run(kind, args.jobs, url))
    for kind in KINDS:
        rates = [rate for rate, _ in figures[kind]]
        cpu = [ms for _, ms in figures[kind]]
        print(
            '%-6s jobs_per_s=%.0f cpu_ms_per_job=%.3f (rounds: %s)'
            % (
                kind,
                statistics.median(rates),
                statistics.median(cpu),
                ', '.join('%.0f' % rate for rate in rates),
            )
        )


if __name__ == '__main__':
    main()
