"""What a lone job's lock and finish cost the worker's process (issue 23): ``lock_jobs`` for one
job, then its success written by a group commit as the worker writes it, one job at a time.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/bench_lock python benchmarks/lock_finish.py \
        [--jobs 1000]

On the database the URL names (its tables are created if missing; use a database of its own):
``--jobs`` synthetic jobs are created, then each is locked and finished in turn. Printed: CPU
(this process) and wall clock per job for the lock and for the finish, and for a bare
``SELECT 1`` as the day's yardstick (the machine's speed changes from day to day: compare two
versions of the code alternately, in one session). Round trips per lock and per finish come
from the store's own count.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine.core.fences import Fence  # noqa: E402
from engine.core.service import CreateJobInput  # noqa: E402
from engine.execution.engine import ExecutionEngine  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

WORKER = 'worker-bench'


class Meter:
    """CPU, wall clock and round trips summed over the measured calls."""

    def __init__(self, store):
        self.store = store
        self.cpu = self.wall = 0.0
        self.round_trips = self.calls = 0

    def measure(self, call):
        cpu, wall, trips = time.process_time(), time.perf_counter(), self.store.round_trip_count()
        result = call()
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall
        self.round_trips += self.store.round_trip_count() - trips
        self.calls += 1
        return result

    def line(self, name):
        return '%s: cpu_us=%.1f wall_us=%.1f round_trips=%.2f' % (
            name,
            self.cpu / self.calls * 1e6,
            self.wall / self.calls * 1e6,
            self.round_trips / self.calls,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--jobs', type=int, default=1000)
    args = parser.parse_args()
    runtime = Runtime(load_config(), role='bench')
    runtime.create_schema()
    runtime.service.dispatch_now = None  # no push: the worker's side only
    store, lifecycle = runtime.store, runtime.lifecycle
    finishes = ExecutionEngine(runtime, WORKER).group_commit  # the worker's own
    lock, finish, select = Meter(store), Meter(store), Meter(store)
    with store.connection():
        ids = [
            runtime.service.create_job(
                CreateJobInput(
                    user_id='bench-%d' % (i % 50),
                    job_type='synthetic',
                    target_type='bench',
                    target_id=str(i),
                    input={},
                )
            ).job.id
            for i in range(args.jobs)
        ]
        for job_id in ids:
            locked = lock.measure(lambda job_id=job_id: lifecycle.lock_jobs([job_id], WORKER))
            assert [job.id for job, _ in locked] == [job_id]
            fence = Fence(WORKER, locked[0][0].attempt_no)
            work = [lambda tx, j=job_id, f=fence: lifecycle.mark_succeeded(j, fence=f)]
            assert finish.measure(lambda work=work: finishes.run(work)) == [None]
        for _ in ids:
            select.measure(lambda: store.db.execute_sql('SELECT 1').fetchall())
    for meter, name in ((lock, 'lock'), (finish, 'finish'), (select, 'select_1')):
        print(meter.line(name))


if __name__ == '__main__':
    main()
