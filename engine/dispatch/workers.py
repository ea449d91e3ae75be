"""Worker processes (contracts §3.1): a thread pool per queue, the supervisor that heartbeats, and
the ordered, bounded shutdown of ``python aijob.py worker``.

Shutdown follows dramatiq's order: stop taking messages, keep heartbeating while running jobs
finish within the grace period, then hand back what is still running (release the lock, put the
message back) and join everything under one deadline. Signal handlers only set flags.
"""

import _thread
import functools
import logging
import os
import signal
import threading
import time
from contextlib import nullcontext

from ..core.errors import JobLockConflictError, QueueUnavailableError
from ..core.lifecycle_sql import LOCK_BATCH
from ..core.logs import log_event
from ..core.states import RUNNING
from ..execution.engine import ExecutionEngine
from .leader import Leadership
from .wake import Waker

EXIT_FORCED = 3  # a second SIGTERM/SIGINT: exit now, takeover recovers the jobs


def run_every(name, interval_s, step, stop, connection, active=None):
    """A daemon thread calling ``step()`` every ``interval_s`` until ``stop`` is set, skipping
    the turns when ``active()`` says no (housekeeping on a follower). An error is logged when a
    loop starts failing and again when it recovers, not at every turn of an outage, and the loop
    goes on (a store or Redis outage must not kill it)."""

    def loop():
        failing = False
        while not stop.is_set():
            if active is None or active():
                try:
                    with connection():
                        step()
                    if failing:
                        failing = False
                        log_event('loop.recovered', loop=name)
                except Exception:
                    if not failing:
                        failing = True
                        log_event('loop.step_failed', logging.ERROR, exc_info=True, loop=name)
            stop.wait(interval_s)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


QUEUE_EPOCH_CHECK_S = 1.0
# Jobs a runner takes at once at most (AIJOB_CLAIM_AHEAD_MS).
CLAIM_MAX = 50
# Messages one pop of a fetcher takes at most: as many jobs as one lock statement claims.
FETCH_MAX = LOCK_BATCH
# Jobs that run in less than this each are instant (ClaimSize.instant): the fetcher pops the
# next ones once their runner is done, so that they come in batches (WorkerPool.fetch_once).
INSTANT_JOB_S = 0.001


class ClaimSize:
    """How many jobs one runner runs in turn: as many as it expects to run in
    ``claim_ahead_ms``, from a moving average of the time its jobs ran (their lock and final
    commit, shared by a batch, left out). Long jobs (an AI call of seconds) get a runner each,
    so no job waits behind another; jobs of a millisecond are run by the dozen, and their
    results cost one commit per batch instead of one per job."""

    def __init__(self, claim_ahead_ms, most=CLAIM_MAX):
        self.ahead_s = claim_ahead_ms / 1000.0
        self.most = most
        self.per_job_s = None  # unknown until the first batch

    def next(self):
        if not self.ahead_s or self.per_job_s is None:
            return 1
        return max(1, min(self.most, int(self.ahead_s / max(self.per_job_s, 1e-4))))

    def instant(self):
        """Whether the jobs run in under a millisecond each (INSTANT_JOB_S): work for the
        core, not waits on the network (whose runners the fetcher never waits for)."""
        return bool(self.ahead_s) and self.per_job_s is not None and self.per_job_s < INSTANT_JOB_S

    def observe(self, seconds):
        """One job ran for ``seconds``."""
        if self.per_job_s is None:
            self.per_job_s = seconds
        else:
            self.per_job_s = 0.8 * self.per_job_s + 0.2 * seconds


class Slots:
    """The ``concurrency`` jobs a pool may hold at once: taken by the fetcher when it pops,
    given back by a runner as each job's message is acknowledged."""

    def __init__(self, total):
        self.total = total
        self.free = total
        self._changed = threading.Condition()

    def wait_free(self, timeout_s):
        """How many are free, after waiting up to ``timeout_s`` for at least one."""
        with self._changed:
            self._changed.wait_for(lambda: self.free > 0, timeout_s)
            return self.free

    def take(self, n):
        with self._changed:
            self.free -= n

    def give_back(self, n):
        with self._changed:
            self.free += n
            self._changed.notify_all()

    def wait_all_free(self, deadline):
        with self._changed:
            return self._changed.wait_for(
                lambda: self.free == self.total, max(0.0, deadline - time.monotonic())
            )


class Acks:
    """Acknowledgements coalesced: a runner done with its messages adds them, and the first to
    find no one acknowledging acknowledges everything added until none is left, one call per
    turn (a worker finishing thousands of jobs at once makes a few dozen calls, not thousands).
    The others go on at once: their messages are acknowledged by that runner."""

    def __init__(self, queue, queue_name):
        self.queue = queue
        self.queue_name = queue_name
        self._lock = threading.Lock()
        self._pending = []
        self._sending = False

    def add(self, deliveries):
        with self._lock:
            self._pending.extend(deliveries)
            if self._sending:
                return
            self._sending = True
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._sending = False
                    return
            self._send(batch)

    def _send(self, batch):
        try:
            self.queue.ack_many(batch)
        except Exception as exc:  # an ack lost must not stop the others
            # Left in this consumer's processing list, whose jobs are finished: recovered as
            # orphans (and found finished) once this consumer is gone.
            log_event('queue.ack_failed', logging.WARNING, queue=self.queue_name, error=str(exc))


class WorkerPool:
    """One queue's consumer in this process: a fetcher pops messages for the free slots (at
    most ``concurrency`` jobs at once), claims their jobs in one lock statement, and hands them
    to runners, one per job for long jobs, a few short jobs each for short ones (ClaimSize).

    A slot costs no thread and no connection while its job waits: only the fetcher blocks on
    the queue (one Redis connection per pool, whatever the concurrency), a runner lives as long
    as its jobs, and it holds a database connection only while the engine does database work
    (``ExecutionEngine``). In ``python aijob.py worker`` threads are gevent's greenlets
    (aijob.py), so a runner waiting on a provider call costs a few kilobytes."""

    def __init__(self, queue_name, concurrency, queue, engine, consumer_id, claim_ahead_ms=0):
        self.queue_name = queue_name
        self.concurrency = concurrency
        self.queue = queue
        self.engine = engine
        self.consumer_id = consumer_id
        self.claim_ahead_ms = claim_ahead_ms
        self.claim = ClaimSize(claim_ahead_ms)
        self.slots = Slots(concurrency)
        self.acks = Acks(queue, queue_name)
        self.stopping = threading.Event()
        self.fetcher = None
        # The instant runners of the last fetch still running, and when they started
        # (fetch_once); the fetches are numbered, so a runner of an earlier fetch (an instant
        # job that turned out slow) keeps no later fetch waiting.
        self._fetches = 0
        self._instant_runners = 0
        self._instant_since = 0.0
        self._instant_done = threading.Condition()

    def start(self):
        self.fetcher = threading.Thread(
            target=self._fetch_loop, daemon=True, name='%s-fetcher' % self.queue_name
        )
        self.fetcher.start()

    def fetch_once(self, timeout_s=1.0):
        """Pop messages for the free slots (waiting up to ``timeout_s`` for one), claim their
        jobs and start their runners. Returns how many messages came.

        While the runners of instant jobs the last fetch started run, the fetcher first waits
        for their end (until ``claim_ahead_ms`` after their start): in a burst, popping while
        that runner holds the core would take the messages in ones and twos as they arrive,
        each pop paying its own lock statement and its runner its own commit (twice the
        statements per job, measured). Waiting, the fetcher takes what came meanwhile in one
        batch, as a pool of busy threads did. Runners of jobs that wait on the network are
        never waited for: their slots stay as many as ``concurrency``."""
        self.instant_runners_done(self.claim.ahead_s)
        free = self.slots.wait_free(timeout_s)
        if not free or self.stopping.is_set():
            return 0
        want = min(free, FETCH_MAX)
        deliveries = self.queue.pop_many(self.queue_name, self.consumer_id, want, timeout_s)
        if not deliveries:
            return 0
        self.slots.take(len(deliveries))
        if self.stopping.is_set():  # popped while stopping: not ours to start
            self._hand_back(deliveries)
            return len(deliveries)
        try:
            claimed = self.engine.claim([d.message.job_id for d in deliveries])
        except Exception:
            # The store failed under us (the engine handles job failures itself): put the
            # messages back rather than strand them in this live consumer's processing list.
            self._hand_back(deliveries)
            raise
        self._start_runners(deliveries, claimed)
        return len(deliveries)

    def _start_runners(self, deliveries, claimed):
        by_job = {d.message.job_id: d for d in deliveries}
        unclaimed = set(by_job) - {attempt.job.id for attempt, _ in claimed}
        if unclaimed:  # locked elsewhere, gone or finished: done with their messages
            done = [by_job[job_id] for job_id in unclaimed]
            self._finish(done, [])
        size = self.claim.next()
        chunks = [claimed[start : start + size] for start in range(0, len(claimed), size)]
        with self._instant_done:
            self._fetches += 1
            fetch = self._fetches if self.claim.instant() else None
            self._instant_runners = len(chunks) if fetch else 0
            self._instant_since = time.monotonic()
        for chunk in chunks:
            mine = [by_job[attempt.job.id] for attempt, _ in chunk]
            # A bare thread (a greenlet in the worker): thousands start in a burst, and a
            # threading.Thread's own locks and bookkeeping would cost more than the job's.
            _thread.start_new_thread(self._run, (chunk, mine, fetch))

    def instant_runners_done(self, timeout_s):
        """Wait for the instant runners of the last fetch to end, until ``timeout_s`` after
        they started; True if they have."""
        with self._instant_done:
            left = self._instant_since + timeout_s - time.monotonic()
            return self._instant_done.wait_for(lambda: not self._instant_runners, max(0.0, left))

    def _run(self, chunk, deliveries, fetch=None):
        """``fetch``: the number of the fetch that started this runner, if its jobs are
        instant."""
        try:
            self._run_jobs(chunk, deliveries)
        finally:
            if fetch is not None:
                with self._instant_done:
                    if fetch == self._fetches:
                        self._instant_runners -= 1
                        self._instant_done.notify_all()

    def _run_jobs(self, chunk, deliveries):
        """A runner: its jobs in turn, then their messages acknowledged (or handed back when
        the worker stops under them), then their slots freed."""
        try:
            statuses = self.engine.run_claimed(
                chunk, self.claim_ahead_ms / 1000.0, self.claim.observe
            )
        except Exception:
            log_event('worker.run_error', logging.ERROR, exc_info=True, queue=self.queue_name)
            self._hand_back(deliveries)
            return
        done, back = [], []
        for delivery in deliveries:
            # None while stopping: abandoned, handed back for another worker to take over.
            stopped = statuses.get(delivery.message.job_id) is None and self.stopping.is_set()
            (back if stopped else done).append(delivery)
        self._finish(done, back)

    def _finish(self, done, back):
        """Acknowledge ``done`` (finished, or a duplicate of a job run elsewhere) and hand
        ``back`` to another worker; their slots are free again either way."""
        try:
            if done:
                self.acks.add(done)
            for delivery in back:
                self.queue.release(delivery)
        except QueueUnavailableError as exc:
            # Left in this consumer's processing list: recovered as orphans once it is gone.
            log_event(
                'queue.release_failed', logging.WARNING, queue=self.queue_name, error=str(exc)
            )
        finally:
            self.slots.give_back(len(done) + len(back))

    def _hand_back(self, deliveries):
        self._finish([], deliveries)

    def _fetch_loop(self):
        backoff = 0.0
        while not self.stopping.is_set():
            try:
                self.fetch_once(timeout_s=1.0)
                backoff = 0.0
            except QueueUnavailableError as exc:
                backoff = min(10.0, max(0.2, backoff * 2))
                log_event(
                    'queue.unavailable',
                    logging.WARNING,
                    component='worker',
                    queue=self.queue_name,
                    retry_in_s=round(backoff, 1),
                    error=str(exc),
                )
                self.stopping.wait(backoff)
            except Exception:
                log_event('worker.loop_error', logging.ERROR, exc_info=True, queue=self.queue_name)
                self.stopping.wait(0.5)

    def join(self, deadline):
        """True once the fetcher has stopped and every job taken has been let go."""
        if self.fetcher is not None:
            self.fetcher.join(max(0.0, deadline - time.monotonic()))
        return self.slots.wait_all_free(deadline) and not (
            self.fetcher is not None and self.fetcher.is_alive()
        )


class Supervisor:
    """Keeps this consumer's heartbeat key alive, extends the lock of every job it runs, and
    turns cancel requests (database flag or the ``job:cancel`` fast path) into stop events."""

    def __init__(self, runtime, engine, consumer_id):
        self.lifecycle = runtime.lifecycle
        self.queue = runtime.queue
        self.engine = engine
        self.consumer_id = consumer_id
        self.lock_ttl_ms = runtime.config.lock_ttl_ms
        self.heartbeat_ttl_ms = runtime.config.reap_after_ms
        self._cancels_seen = None  # cancel_signals_sent at the last look at the flags

    def beat(self):
        """The heartbeat (contracts §1.7): every held lock, then this consumer's key. The locks
        come first and never wait on Redis: a queue outage must not let a live job's lock expire
        (the reaper would hand it to another worker)."""
        self.extend_held_locks()
        self.refresh_consumer_key()

    def extend_held_locks(self):
        """Every lock this worker holds, in two statements per batch however many it runs."""
        self.extend_locks(self.engine.held_attempts())

    def refresh_consumer_key(self):
        """This consumer's heartbeat key in the queue: while it lives, the reaper leaves its
        processing list alone."""
        self.queue.heartbeat(self.consumer_id, self.heartbeat_ttl_ms)

    def extend_locks(self, attempts):
        """Extend the locks of ``attempts`` (lifecycle.extend_locks); an attempt whose fence no
        longer holds (another worker took the job over, or it left ``running`` under us) is
        abandoned, alone; one whose job has a cancel request is told to stop."""
        if not attempts:
            return
        holders = self.lifecycle.extend_locks(
            [a.job.id for a in attempts], self.consumer_id, self.lock_ttl_ms
        )
        for attempt in attempts:
            status, locked_by, attempt_no, cancel_requested_at = holders.get(
                attempt.job.id, (None, None, None, None)
            )
            fence = attempt.fence
            if (status, locked_by, attempt_no) != (RUNNING, fence.instance_id, fence.attempt_no):
                if self.engine.holds(attempt):  # not merely finished since we listed it
                    log_event('job.lock_lost', logging.WARNING, job_id=attempt.job.id)
                    attempt.abandon()
                continue
            if cancel_requested_at is not None:
                attempt.cancel_event.set()

    def check_cancel_signals(self):
        """The fast path: a cancel reaches a running job within a fraction of a second. The
        jobs' flags are read only when a cancel was signalled since the last look (one read
        per turn, not one per running job); the heartbeat's lock extension reads the
        database's cancel requests whatever happens here."""
        sent = self.queue.cancel_signals_sent()
        if sent == self._cancels_seen:
            return
        attempts = {a.job.id: a for a in self.engine.held_attempts()}
        if attempts:
            for job_id in self.queue.cancel_signalled(attempts):
                attempts[job_id].cancel_event.set()
        self._cancels_seen = sent  # after the look: a failed look is tried again


class Worker:
    """Worker pools, supervisor and the housekeeping loops, in this process. The housekeeping
    (reaper, reconciler, outbox polling, terminal events, purge, the extensions' ``leader_steps``)
    runs only while this process
    holds the leader lease (architecture decision 12); the rest runs in every process. With
    ``with_maintenance=False`` the process never stands for the lease: job threads only."""

    def __init__(self, runtime, with_maintenance=True):
        self.runtime = runtime
        config = runtime.config
        # Deferred jobs' wake-ups, pushed from this process at their time (dispatch.wake).
        self.waker = Waker(
            runtime.dispatcher, runtime.outbox, runtime.instance_id, runtime.store.connection
        )
        self.engine = ExecutionEngine(runtime, runtime.instance_id, waker=self.waker)
        self.pools = [
            WorkerPool(
                'ai-interactive',
                config.interactive_concurrency,
                runtime.queue,
                self.engine,
                runtime.instance_id,
                config.claim_ahead_ms,
            ),
            WorkerPool(
                'ai-background',
                config.background_concurrency,
                runtime.queue,
                self.engine,
                runtime.instance_id,
                config.claim_ahead_ms,
            ),
        ]
        self.supervisor = Supervisor(runtime, self.engine, runtime.instance_id)
        self.leadership = Leadership(runtime.store, runtime.instance_id, config.leader_lease_ms)
        self.with_maintenance = with_maintenance
        self.stop_event = threading.Event()
        self.threads = []

    def start(self):
        rt, config, conn = self.runtime, self.runtime.config, self.runtime.store.connection
        self._first_beat()
        if self.with_maintenance:
            # The first attempt at the lease before anything else: a process alone leads at once.
            first_wait = self.leadership.step()
            self._thread('leader', self.leadership.run, self.stop_event, first_wait)
        lead = self.leadership.held
        self._thread('dispatcher', rt.dispatcher.run, self.stop_event, conn, lead)
        # The extensions' loops (webhook sends), each on a thread of its own.
        for name, run, _ in rt.hooks.worker_loops:
            self._thread(name, run, self.stop_event, conn, lead)
        heartbeat_s = config.heartbeat_ms / 1000.0
        self._every('lock-extension', heartbeat_s, self.supervisor.extend_held_locks, conn)
        # The consumer key and the cancel signals are Redis's: no unit of database work.
        self._every('heartbeat', heartbeat_s, self.supervisor.refresh_consumer_key, nullcontext)
        self._every('cancel-signals', 0.2, self.supervisor.check_cancel_signals, nullcontext)
        if self.with_maintenance:
            self._every('reaper', config.reaper_interval_ms / 1000.0, rt.reaper.sweep, conn, lead)
            self._every(
                'reconciler', config.reconcile_after_ms / 2000.0, rt.reconciler.sweep, conn, lead
            )
            # A queue that lost its data (Redis restarted empty) is noticed within a second.
            self._every('queue-epoch', QUEUE_EPOCH_CHECK_S, rt.reconciler.check_epoch, conn, lead)
            self._every('purger', config.purge_interval_ms / 1000.0, rt.purger.sweep, conn, lead)
            # Terminal events to the extensions' handlers (the webhooks' fan-out).
            poll_s = config.outbox_poll_ms / 1000.0
            self._every('terminal-events', poll_s, rt.terminal_events.drain, conn, lead)
            # The gateway's own leader work (provider batches), handed in by the runtime; a
            # long step asks again between its provider calls whether this process still leads.
            for name, interval_s, step in rt.hooks.leader_steps:
                self._every(name, interval_s, functools.partial(step, lead), conn, lead)
        for pool in self.pools:
            pool.start()
        log_event(
            'worker.started',
            instance=rt.instance_id,
            interactive=config.interactive_concurrency,
            background=config.background_concurrency,
            leader=self.leadership.held(),
        )

    def _first_beat(self):
        """The consumer key before the pools take anything, so no reaper takes this consumer
        for dead. A queue that is down, failing over or still electing its cluster's slots does
        not stop the worker: the heartbeat loop tries every AIJOB_HEARTBEAT_MS, and the pools
        retry their pops."""
        try:
            self.supervisor.refresh_consumer_key()
        except QueueUnavailableError as exc:
            log_event('worker.first_heartbeat_failed', logging.WARNING, error=str(exc))

    def _thread(self, name, target, *args):
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _every(self, name, interval_s, step, connection, active=None):
        self.threads.append(
            run_every(name, interval_s, step, self.stop_event, connection, active=active)
        )

    def stop(self, grace_s):
        """Ordered stop within ``grace_s`` (plus a few seconds to hand back)."""
        deadline = time.monotonic() + grace_s
        for pool in self.pools:
            pool.stopping.set()
        finished = all(pool.join(deadline) for pool in self.pools)
        if not finished:
            self._hand_back()
            hand_back_deadline = time.monotonic() + 5.0
            for pool in self.pools:
                pool.join(hand_back_deadline)
        self.waker.close()  # wake-ups not yet due go back to the outbox, for the leader
        self.stop_event.set()
        self.runtime.dispatcher.wake.set()
        for _, _, wake in self.runtime.hooks.worker_loops:
            wake()
        for thread in self.threads:
            thread.join(2.0)
        self.leadership.release()
        log_event(
            'worker.stopped',
            instance=self.runtime.instance_id,
            outcome='all jobs finished' if finished else 'running jobs handed back',
            commits=self.runtime.store.commit_count(),
            statements=self.runtime.store.statement_count(),
            round_trips=self.runtime.store.round_trip_count(),
            cpu_ms=round(time.process_time() * 1000.0, 1),  # this whole process, every thread
        )

    def _hand_back(self):
        with self.runtime.store.connection():
            for attempt in self.engine.held_attempts():
                try:
                    self.runtime.lifecycle.release_lock(attempt.job.id, attempt.fence)
                except JobLockConflictError:
                    pass
                attempt.abandon()

    def run_until_signalled(self):
        """``python aijob.py worker``: start, and return at the first SIGTERM/SIGINT for the
        caller to stop; a second signal exits at once."""
        signals = []

        def on_signal(signum, frame):
            signals.append(signum)
            if len(signals) > 1:
                os._exit(EXIT_FORCED)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        while not signals:
            time.sleep(0.2)
        log_event(
            'worker.stopping', signal=signals[0], grace_ms=self.runtime.config.shutdown_grace_ms
        )
