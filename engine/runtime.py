"""Wiring: one place that builds the engine's parts from a Config, for the CLI, the WSGI app and
the tests alike."""
import os
import socket

import logging

from .ai_services import build_ai_services
from .dispatcher import OutboxDispatcher
from .errors import QueueUnavailableError
from .flashcards import FLASHCARD_JOB_DEFINITION
from .lifecycle import AiJobLifecycleRepository
from .limits import Admission
from .maintenance import Reaper, Reconciler
from .outbox import OutboxRepository
from .queues import open_queue
from .registry import JobDefinitionRegistry
from .service import AiJobService
from .store import Store
from .synthetic import SYNTHETIC_JOB_DEFINITION


def build_registry(config):
    """The default definitions (synthetic, flashcard_generation), then the application's modules."""
    registry = JobDefinitionRegistry()
    registry.register(SYNTHETIC_JOB_DEFINITION)
    registry.register(FLASHCARD_JOB_DEFINITION)
    for module_name in config.definitions:
        registry.load_module(module_name)
    return registry


def instance_id(role):
    """A name for this process, unique across hosts and restarts."""
    return '%s:%s:%d:%s' % (role, socket.gethostname()[:24], os.getpid(), os.urandom(3).hex())


log = logging.getLogger('aijob.runtime')


class Runtime:
    """The parts of one process: store, registry, repositories, service, queue and the loops
    that move jobs (started by ``start_background`` in worker and serve processes)."""

    def __init__(self, config, role='cli', registry=None):
        self.config = config
        self.instance_id = instance_id(role)
        self.store = Store(config.database_url, pool_size=config.db_pool_size)
        self.registry = registry or build_registry(config)
        self.lifecycle = AiJobLifecycleRepository(self.store, lock_ttl_ms=config.lock_ttl_ms)
        self.outbox = OutboxRepository(self.store, lock_ttl_ms=config.outbox_lock_ttl_ms)
        self.service = AiJobService(self.store, self.registry, self.lifecycle, self.outbox,
                                    instance_id=self.instance_id)
        self.ai = build_ai_services(config, self.store)
        # Per-user limits and platform availability, checked before a job is written (ADR §7.3).
        self.service.admission = Admission.from_config(config, self.store, self.ai)
        self.queue = open_queue(config)
        self.dispatcher = OutboxDispatcher(
            self.outbox, self.queue, self.instance_id, poll_ms=config.outbox_poll_ms,
            release_ms=config.outbox_release_ms, lock_ttl_ms=config.outbox_lock_ttl_ms)
        self.reaper = Reaper(self.lifecycle, self.queue, reap_after_ms=config.reap_after_ms)
        self.reconciler = Reconciler(self.lifecycle, self.queue, after_ms=config.reconcile_after_ms)
        self.service.cancel_signal = self._signal_cancel
        if config.uses_redis:
            # Any process that can reach the shared queue pushes its own new jobs at once
            # (DESIGN decision 6); with the in-memory queue only a process running workers can.
            self.service.dispatch_now = self._dispatch_now
        self.worker = None

    def attach_worker(self, with_maintenance=True):
        """This process's Worker (dispatcher, pools, supervisor, reaper, reconciler), not yet
        started; from now on this process also pushes the jobs it creates at once."""
        from .workers import Worker
        self.worker = Worker(self, with_maintenance=with_maintenance)
        self.service.dispatch_now = self._dispatch_now
        return self.worker

    def start_background(self, with_maintenance=True):
        """Run the dispatcher, worker pools, supervisor, reaper and reconciler in this process."""
        self.attach_worker(with_maintenance).start()
        return self.worker

    def stop_background(self, timeout_s=None):
        if self.worker is not None:
            grace = self.config.shutdown_grace_ms / 1000.0 if timeout_s is None else timeout_s
            self.worker.stop(grace)
            self.worker = None

    def _dispatch_now(self, event):
        """Push an event claimed in the create transaction. A failure here is not the client's:
        the claim expires and the dispatcher's polling publishes it."""
        try:
            self.dispatcher.publish_claimed(event)
        except Exception:
            log.exception('immediate dispatch of outbox event %s failed; polling will retry', event.id)

    def _signal_cancel(self, job_id):
        try:
            self.queue.signal_cancel(job_id)
        except QueueUnavailableError:
            log.warning('cancel signal for job %s not sent (queue down); the database flag stands', job_id)

    def close(self):
        self.stop_background(timeout_s=5)
        self.queue.close()
        self.store.close()
