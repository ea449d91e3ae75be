"""How webhooks join a runtime."""

import functools
import os
from typing import Any, NamedTuple

from ...core.extension import Extension, Tables
from ...core.logs import log_event
from . import models
from .job_url import job_url_field
from .repository import WebhookRepository
from .routes import WebhookRoutes
from .sender import WebhookSender, run_webhooks
from .settings import SETTINGS
from .signing import WebhookSigner
from .urls import UrlPolicy

SCHEMA_SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema.sql')


class Webhooks(NamedTuple):
    """The feature's handle (``Runtime.features['webhooks']``): what its routes and tests use."""

    repository: Any  # WebhookRepository
    policy: Any  # UrlPolicy
    signer: Any  # WebhookSigner
    sender: Any  # WebhookSender


class WebhooksExtension(Extension):
    """Webhooks: the tables, the fan-out of each terminal event (on the housekeeping leader),
    the sender loop of every worker process, a job's own webhookUrl in the create body, the
    purge of old deliveries, the API, and the master key's need (secrets derive from it)."""

    name = 'webhooks'
    settings = SETTINGS

    def install(self, kernel, hooks, features):
        config = kernel.config
        repository = WebhookRepository(kernel.store)
        policy = UrlPolicy(config.webhook_allow_http, config.webhook_allow_private)
        signer = WebhookSigner(config.credential_master_key)
        sender = WebhookSender(
            repository, signer, policy, kernel.instance_id, kernel.store.connection, config
        )
        hooks.tables.append(Tables(models.MODELS, SCHEMA_SQL))
        hooks.keyed_tables.append(('webhook endpoints', models.WebhookEndpoint))
        hooks.create_fields.append(job_url_field(repository, policy, signer))
        hooks.terminal_events.append(functools.partial(fan_out, repository))
        # On a thread of its own, sending from its own bounded pool: a slow receiver never
        # takes a job thread or delays the dispatcher.
        poll_s = config.outbox_poll_ms / 1000.0
        run = functools.partial(run_webhooks, sender, poll_s)
        hooks.worker_loops.append(('webhooks', run, sender.wake.set))
        purge = functools.partial(repository.purge_finished, config.webhook_retention_ms)
        hooks.purge_steps.append(('webhook_deliveries', purge))
        hooks.http_resources.append(WebhookRoutes)
        return Webhooks(repository, policy, signer, sender)


def fan_out(repository, events):
    """The terminal events' handler: one pending delivery per endpoint that wants each."""
    deliveries = repository.fan_out(events)
    if deliveries:
        log_event('webhook.fanned_out', events=len(events), deliveries=deliveries)
    return deliveries
