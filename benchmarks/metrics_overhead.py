"""What counting costs on the hot path (README "Metrics"): the time of each signal the engine
sends per job (engine/core/signals.py), counted by the metrics feature's receiver
(engine/features/metrics/counters.py), in a single process (``worker``) and in prometheus-client's
multiprocess mode (``web`` and ``serve``, writing to files), and their sum for one job next to
the ~2.5 ms of Python CPU a job takes (docs/architecture.md, decision 10). Prints medians of
several rounds.

    python benchmarks/metrics_overhead.py [--calls 200000] [--rounds 5]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.signals import Signals  # noqa: E402
from engine.execution.providers import Usage  # noqa: E402
from engine.features.metrics import processes  # noqa: E402
from engine.features.metrics.counters import Counting  # noqa: E402

USAGE = Usage(prompt_tokens=120, completion_tokens=40)
# As a runtime with the metrics extension installed says it: through the kernel's Signals.
metrics = Signals([Counting()])

# The calls one job makes: created, started, one provider call, finished, and the HTTP requests
# of a create and two status reads.
PER_JOB = (
    ('job_created', lambda: metrics.job_created('synthetic', 'ai-interactive')),
    ('job_started', lambda: metrics.job_started('synthetic', 'ai-interactive', 0.004)),
    (
        'provider_call',
        lambda: metrics.provider_call('synthetic', 'synthetic-1', None, 0.2, USAGE, 0.0001),
    ),
    (
        'job_finished',
        lambda: metrics.job_finished('synthetic', 'ai-interactive', 'succeeded', 0.21),
    ),
    ('http_request', lambda: metrics.http_request('POST', '/api/ai/jobs', 201, 0.003)),
    ('http_request', lambda: metrics.http_request('GET', '/api/ai/jobs/<job_id>', 200, 0.001)),
    ('http_request', lambda: metrics.http_request('GET', '/api/ai/jobs/<job_id>', 200, 0.001)),
)
JOB_CPU_US = 2500.0


def time_call(call, calls):
    """µs of this process's CPU per call (CPU time, not wall time: on a shared machine other
    processes' load would count otherwise)."""
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e6


def measure(calls, rounds):
    """{name: median µs per call}, and the median µs of one job's calls together."""
    for _, call in PER_JOB:
        call()  # children made before timing
    per_call = {}
    for name, call in PER_JOB:
        per_call[name] = statistics.median(time_call(call, calls) for _ in range(rounds))

    def one_job():
        for _, call in PER_JOB:
            call()

    job = statistics.median(time_call(one_job, calls // len(PER_JOB)) for _ in range(rounds))
    return per_call, job


def report(mode, per_call, job):
    print('%s:' % mode)
    for name, us in per_call.items():
        print('  %-14s %6.2f µs per call' % (name, us))
    print(
        '  one job (%d calls) %6.2f µs = %.2f%% of %.0f µs of job CPU'
        % (len(PER_JOB), job, job / JOB_CPU_US * 100, JOB_CPU_US)
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--calls', type=int, default=200_000)
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args()
    report('single process (worker)', *measure(args.calls, args.rounds))
    os.environ.pop(processes.MULTIPROC_ENV, None)
    with tempfile.TemporaryDirectory() as directory:
        os.environ[processes.MULTIPROC_ENV] = directory
        processes.use_multiprocess_dir()
        report('multiprocess files (web, serve)', *measure(args.calls, args.rounds))


if __name__ == '__main__':
    main()
