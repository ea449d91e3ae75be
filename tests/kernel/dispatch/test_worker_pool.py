"""A pool's fetcher (engine/dispatch/workers.py): in a burst of instant jobs it pops the next
messages once their runner is done, so that they come in batches; it never waits for runners
of jobs that wait on the network. The engine here is a stand-in whose runs wait on a gate, so
that a test decides when a runner ends; the queue is the embedded one (the fetcher's wait is
the pool's own, whatever the backend)."""

import threading
import time
from types import SimpleNamespace

from engine.dispatch.memory_queue import MemoryQueue
from engine.dispatch.queue import Message
from engine.dispatch.workers import INSTANT_JOB_S, ClaimSize, WorkerPool

QUEUE = 'ai-interactive'
CLAIM_AHEAD_MS = 50


class GatedEngine:
    """Claims every job it is given; a runner's jobs each run in ``job_s`` (as the pool's
    ClaimSize hears it) once ``gate`` is open, except those of a job in ``free``, which run at
    once."""

    def __init__(self, job_s):
        self.job_s = job_s
        self.gate = threading.Event()
        self.free = set()
        self.claims = []  # (monotonic time, job ids) of each claim
        self.runs_ended = {}  # the first job id of each runner -> monotonic time its jobs ended

    def claim(self, job_ids):
        self.claims.append((time.monotonic(), list(job_ids)))
        return [(SimpleNamespace(job=SimpleNamespace(id=job_id)), None) for job_id in job_ids]

    def run_claimed(self, chunk, flush_after_s, on_job_ran):
        if chunk[0][0].job.id not in self.free:
            self.gate.wait(30)
        for _ in chunk:
            on_job_ran(self.job_s)
        self.runs_ended[chunk[0][0].job.id] = time.monotonic()
        return {attempt.job.id: 'succeeded' for attempt, _ in chunk}


def push(queue, *job_ids):
    for job_id in job_ids:
        queue.push(Message(job_id, 'synthetic', QUEUE, 0, time.time(), 'user-%s' % job_id))


def pool_that_has_run(job_s):
    """A pool whose first job ran in ``job_s``: its ClaimSize knows how long jobs take."""
    queue = MemoryQueue()
    engine = GatedEngine(job_s)
    pool = WorkerPool(QUEUE, 100, queue, engine, 'consumer-1', CLAIM_AHEAD_MS)
    push(queue, 'first')
    engine.gate.set()
    assert pool.fetch_once(timeout_s=1.0) == 1
    assert pool.slots.wait_all_free(time.monotonic() + 5)
    engine.gate.clear()
    return pool, queue, engine


def test_claim_size_calls_jobs_instant_only_once_they_ran_in_under_a_millisecond():
    sizes = ClaimSize(20)
    assert not sizes.instant()  # nothing known yet: no job is waited for
    sizes.observe(INSTANT_JOB_S / 5)
    assert sizes.instant()
    sizes.observe(2.0)  # a provider call: the average is far above a millisecond
    assert not sizes.instant()
    no_claim_ahead = ClaimSize(0)
    no_claim_ahead.observe(INSTANT_JOB_S / 5)
    assert not no_claim_ahead.instant()  # one job per runner: nothing to batch


def test_the_fetcher_pops_after_an_instant_runner_ends_taking_what_came_meanwhile_at_once():
    pool, queue, engine = pool_that_has_run(INSTANT_JOB_S / 5)
    push(queue, 'a')
    assert pool.fetch_once(timeout_s=1.0) == 1  # its runner waits on the gate
    push(queue, 'b', 'c', 'd')  # arrive while that runner holds the core
    fetched = []
    fetcher = threading.Thread(target=lambda: fetched.append(pool.fetch_once(timeout_s=1.0)))
    fetcher.start()
    engine.gate.set()
    fetcher.join(10)
    assert fetched == [3]  # one pop, one claim for the three
    claimed_at, ids = engine.claims[-1]
    assert sorted(ids) == ['b', 'c', 'd']
    assert claimed_at >= engine.runs_ended['a']  # after a's runner ended, not beside it
    assert pool.slots.wait_all_free(time.monotonic() + 5)


def test_the_fetchers_wait_for_an_instant_runner_ends_a_claim_ahead_after_its_start():
    pool, queue, engine = pool_that_has_run(INSTANT_JOB_S / 5)
    push(queue, 'a')
    started = time.monotonic()  # before a's runner started
    assert pool.fetch_once(timeout_s=1.0) == 1  # its runner stays on the closed gate
    push(queue, 'b')
    engine.free.add('b')
    assert pool.fetch_once(timeout_s=1.0) == 1  # a stuck instant job holds up no other
    assert time.monotonic() - started >= CLAIM_AHEAD_MS / 1000.0
    assert 'a' not in engine.runs_ended  # fetched while a's runner still ran
    # b's runner ends at once: a, started by an earlier fetch, keeps the next fetch waiting
    # for nothing (not a claim ahead at every fetch while it is stuck)
    deadline = time.monotonic() + 5
    while 'b' not in engine.runs_ended and time.monotonic() < deadline:
        time.sleep(0.001)
    assert pool.instant_runners_done(0)
    engine.gate.set()
    assert pool.slots.wait_all_free(time.monotonic() + 5)


def test_the_fetcher_never_waits_for_runners_of_jobs_that_wait_on_the_network():
    pool, queue, engine = pool_that_has_run(2.0)  # a provider call of 2 s
    push(queue, 'a')
    assert pool.fetch_once(timeout_s=1.0) == 1  # its runner waits on the gate
    assert pool.instant_runners_done(0)  # nothing for the fetcher to wait for
    push(queue, 'b', 'c')
    assert pool.fetch_once(timeout_s=1.0) == 2  # popped beside it
    assert 'a' not in engine.runs_ended
    engine.gate.set()
    assert pool.slots.wait_all_free(time.monotonic() + 5)
