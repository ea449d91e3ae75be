"""Wiring: one place that builds the engine's parts from a Config, for the CLI, the WSGI app and
the tests alike."""
import os
import socket

from .ai_services import build_ai_services
from .lifecycle import AiJobLifecycleRepository
from .limits import Admission
from .outbox import OutboxRepository
from .registry import JobDefinitionRegistry
from .service import AiJobService
from .store import Store
from .synthetic import SYNTHETIC_JOB_DEFINITION


def build_registry(config):
    """The default definitions (synthetic), then the application's modules."""
    registry = JobDefinitionRegistry()
    registry.register(SYNTHETIC_JOB_DEFINITION)
    for module_name in config.definitions:
        registry.load_module(module_name)
    return registry


def instance_id(role):
    """A name for this process, unique across hosts and restarts."""
    return '%s:%s:%d:%s' % (role, socket.gethostname()[:24], os.getpid(), os.urandom(3).hex())


class Runtime:
    """The parts of one process: store, registry, repositories and service."""

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

    def close(self):
        self.store.close()
