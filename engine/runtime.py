"""Wiring: one place that builds the engine's parts from a Config, for the CLI, the WSGI app and
the tests alike: the kernel first, then each installed extension (engine/extensions.py) in
order. It sits above core, execution, dispatch, the job types and the extensions, and below
http."""

import contextlib
import gc
import logging
import os
import socket

from .core import master_key
from .core.admission import Admission
from .core.errors import ConfigError, QueueUnavailableError
from .core.extension import Hooks, Kernel
from .core.history import JobHistory
from .core.lifecycle import AiJobLifecycleRepository
from .core.logs import configure as configure_logging
from .core.logs import log_event
from .core.models import MODELS
from .core.outbox import OutboxRepository
from .core.registry import JobDefinitionRegistry
from .core.service import AiJobService, PushNow
from .core.signals import Signals
from .core.store import Store
from .dispatch.dispatcher import OutboxDispatcher
from .dispatch.housekeeping import Purger, Reaper, Reconciler, Retention
from .dispatch.memory_queue import MemoryQueue
from .dispatch.redis_queue import RedisQueue
from .dispatch.terminal import TerminalEvents
from .dispatch.workers import Worker
from .execution.plugins import PluginApp, load_plugin
from .execution.services import build_ai_services
from .extensions import INSTALLED

# The job types every process has; they register through the same entry point as users' own.
BUILTIN_JOB_TYPES = ('engine.jobtypes.synthetic', 'engine.jobtypes.flashcards')


def instance_id(role):
    """A name for this process, unique across hosts and restarts."""
    return '%s:%s:%d:%s' % (role, socket.gethostname()[:24], os.getpid(), os.urandom(3).hex())


def open_queue(config):
    """RedisQueue when AIJOB_REDIS_URL is set, else the in-process MemoryQueue."""
    fair = {
        'user_weights': config.user_weights,
        'max_running_per_user': config.max_running_per_user,
    }
    if config.redis_url:
        return RedisQueue(
            config.redis_url, prefix=config.redis_prefix, shards=config.queue_shards, **fair
        )
    return MemoryQueue(**fair)


def load_job_types(config, registry, ai):
    """The built-in job types, then the modules named in AIJOB_DEFINITIONS; returns the
    PluginApp they registered into (its ``models`` are the plugins' own tables)."""
    app = PluginApp(config, registry, ai)
    for name in BUILTIN_JOB_TYPES + tuple(config.definitions):
        load_plugin(app, name)
    return app


class Runtime:
    """The parts of one process: store, registry, repositories, service, queue and the loops
    that move jobs (started by ``start_background`` in worker and serve processes).

    ``registry``, when given, replaces the plugins' job definitions (tests use variants with
    short backoffs); the plugins' providers, projectors and prompts are loaded all the same.
    ``extensions``: the features to install, in order (engine/extensions.py's tuple unless a
    test says otherwise)."""

    def __init__(self, config, role='cli', registry=None, extensions=INSTALLED):
        self.config = config
        self.instance_id = instance_id(role)
        # The extensions' hook points (engine/core/extension.py): the kernel's parts are built
        # with them and read them; the extensions fill them below, in their order.
        self.hooks = Hooks()
        # What the kernel's parts say as they work, passed to the extensions' receivers.
        self.signals = Signals(self.hooks.signal_receivers)
        self.store = Store(config.database_url, pool_size=config.db_pool_size)
        hooks = self.hooks
        self.ai = build_ai_services(
            config, self.store, hooks.call_guards, hooks.gateways, hooks.prices
        )
        self.plugins = load_job_types(config, JobDefinitionRegistry(), self.ai)
        self.registry = registry or self.plugins.registry
        self.outbox = OutboxRepository(self.store, lock_ttl_ms=config.outbox_lock_ttl_ms)
        self.lifecycle = AiJobLifecycleRepository(
            self.store, lock_ttl_ms=config.lock_ttl_ms, outbox=self.outbox
        )
        self.queue = open_queue(config)
        # Whether this process pushes the jobs it creates at once (architecture decision 6):
        # any process that reaches the shared queue; with the in-memory queue only a process
        # running workers (attach_worker turns it on).
        self.pushes_now = PushNow(self.dispatch_now_pushes, on=config.uses_redis)
        self.service = AiJobService(
            self.store,
            self.registry,
            self.lifecycle,
            self.outbox,
            instance_id=self.instance_id,
            dispatch_now=self.pushes_now,
            # Per-user limits and platform availability, checked before a job is written (§7.3).
            admission=Admission.from_config(config, self.store, self.ai),
            cancel_signal=self._signal_cancel,
            create_checks=self.hooks.create_checks,
            signals=self.signals,
            create_fields=self.hooks.create_fields,
            snapshot_ttl_ms=config.snapshot_ttl_ms,
        )
        # The features, in the order of engine/extensions.py; each handle by its name (None:
        # the configuration leaves it off). Their shared state lives in the queue's Redis
        # when there is one: one lazy handle on its client (None on the embedded default).
        kernel = Kernel(
            config=config,
            store=self.store,
            ai=self.ai,
            registry=self.registry,
            outbox=self.outbox,
            instance_id=self.instance_id,
            redis=_LazyRedis(self.queue) if config.uses_redis else None,
            signals=self.signals,
        )
        self.features = install_extensions(kernel, self.hooks, extensions)
        self.ai.gateway.check_definitions(self.registry.get_all())
        self.dispatcher = OutboxDispatcher(
            self.outbox,
            self.queue,
            self.instance_id,
            poll_ms=config.outbox_poll_ms,
            release_ms=config.outbox_release_ms,
            lock_ttl_ms=config.outbox_lock_ttl_ms,
            store_connection=self.store.connection,
        )
        self.reaper = Reaper(
            self.lifecycle,
            self.queue,
            reap_after_ms=config.reap_after_ms,
            repush_after_ms=config.reconcile_after_ms,
            steps=self.hooks.reaper_steps,
            signals=self.signals,
        )
        self.reconciler = Reconciler(self.lifecycle, self.queue, after_ms=config.reconcile_after_ms)
        self.purger = Purger(
            self.service,
            self.outbox,
            JobHistory(self.store),
            Retention.from_config(config),
            more=self.hooks.purge_steps,
        )
        # The terminal events, to the extensions' handlers (the webhooks' fan-out) on the leader.
        self.terminal_events = TerminalEvents(
            self.outbox, self.store, self.instance_id, self.hooks.terminal_events
        )
        self.worker = None

    def create_schema(self):
        """Every table: the kernel's, the features', then the job-type plugins' own."""
        self.store.create_schema(extra_models=self.plugins.models, tables=self.hooks.tables)

    @property
    def models(self):
        """Every model of this runtime's tables: the kernel's, the features', the plugins'."""
        features = tuple(model for tables in self.hooks.tables for model in tables.models)
        return MODELS + features + tuple(self.plugins.models)

    def attach_worker(self, with_maintenance=True):
        """This process's Worker (dispatcher, pools, supervisor, housekeeping), not yet started;
        from now on this process also pushes the jobs it creates at once."""
        self.worker = Worker(self, with_maintenance=with_maintenance)
        self.pushes_now.on = True
        return self.worker

    def start_background(self, with_maintenance=True):
        """Run the dispatcher, worker pools, supervisor and housekeeping in this process."""
        self.attach_worker(with_maintenance).start()
        return self.worker

    def stop_background(self, timeout_s=None):
        if self.worker is not None:
            grace = self.config.shutdown_grace_ms / 1000.0 if timeout_s is None else timeout_s
            self.worker.stop(grace)
            self.worker = None

    def dispatch_now_pushes(self, events):
        """Push events claimed in a create transaction. A failure here is not the client's:
        the claims expire and the dispatcher's polling publishes them."""
        try:
            self.dispatcher.publish_claimed(events)
        except Exception:
            log_event(
                'outbox.dispatch_now_failed',
                logging.WARNING,
                exc_info=True,
                event_ids=[event.id for event in events],
            )

    def _signal_cancel(self, job_id):
        try:
            self.queue.signal_cancel(job_id)
        except QueueUnavailableError:
            # The database flag stands; the worker sees it at its next check.
            log_event('job.cancel_signal_failed', logging.WARNING, job_id=job_id)

    def close(self):
        self.stop_background(timeout_s=5)
        self.dispatcher.marks.close()
        for close in self.hooks.closers:
            close()
        self.queue.close()
        self.store.close()


def install_extensions(kernel, hooks, extensions):
    """Install ``extensions`` in order; returns their handles by name."""
    features = {}
    for extension in extensions:
        features[extension.name] = extension.install(kernel, hooks, dict(features))
    return features


class _LazyRedis:
    """The queue's Redis client, built at its first use rather than at start-up (a process
    starts while Redis is down, and a cluster's client needs a node to answer)."""

    def __init__(self, queue):
        self._queue = queue

    def __getattr__(self, name):
        return getattr(self._queue.redis, name)


# The worker's collector thresholds: a young collection after this many objects made (Python's
# default is 700), an older one after 20 of the generation below.
GC_THRESHOLDS = (20_000, 20, 20)


def collect_rarely():
    """The worker's cyclic garbage collector, tuned for thousands of waiting jobs. What start-up
    built (modules, the gateway, the clients) lives as long as the process: frozen out of the
    collector's sight, as the web workers do (engine/server.py). And collections come 30 times
    less often. *Why:* each collection stops every job's greenlet; with 2 000 streamed calls
    at once the default thresholds collected 770 times in 14 s, 1.5 s of CPU in all (a tenth
    of the worker's), with pauses up to 128 ms in every stream's reading; with these, 20
    collections, 0.2 s (issue 34). Most of what a job makes is freed by reference counting
    anyway, which the thresholds do not change."""
    gc.collect()  # start-up's garbage first: frozen, it would never go
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_worker_process(config):
    """``python aijob.py worker``: needs Redis, since an in-memory queue cannot cross processes.
    The extensions' ``worker_process`` hooks are around its loops (the metrics' own port)."""
    if not config.uses_redis:
        raise ConfigError(
            'the worker needs AIJOB_REDIS_URL: the in-memory queue cannot cross '
            'processes (use `python aijob.py serve` to run everything in one)'
        )
    configure_logging()
    runtime = Runtime(config, role='worker')
    runtime.store.ping()
    master_key.require(config, runtime.store, runtime.hooks.keyed_tables)
    try:
        runtime.queue.ping()
    except QueueUnavailableError as exc:
        # Redis down or failing over at start: the loops retry until it answers.
        log_event('queue.unavailable', logging.WARNING, component='worker', error=str(exc))
    with contextlib.ExitStack() as around:
        for make in runtime.hooks.worker_process:
            around.enter_context(make(runtime))
        worker = runtime.attach_worker()
        collect_rarely()
        worker.run_until_signalled()
        runtime.stop_background()  # the ordered stop, within AIJOB_SHUTDOWN_GRACE_MS
    runtime.close()
    return 0
