"""The extension protocol: how a feature joins the kernel (docs/architecture.md, "Extensions").

The kernel (store, lifecycle, registry, service, outbox, dispatcher, queues, workers,
housekeeping, the execution engine, the job API) knows no feature. A feature is an
``Extension``: its ``install`` builds the feature's parts from the kernel's and registers them
at the named hook points of ``Hooks``. The kernel's parts are built with those hook points and
only read them; nothing of the kernel is set from outside after it is built. The installed
extensions are one ordered tuple, ``engine/extensions.py``: that order is the order their call
guards run in, and the order they install in (a feature may use what one before it installed).
Each feature lives in one folder, ``engine/features/<name>/``, which declares in its
``__init__`` the other features it imports (``USES``); tests/test_layout.py holds it to that.
"""

from typing import Any, NamedTuple


class Tables(NamedTuple):
    """A feature's own tables: its peewee models (SQLite creates them) and the DDL file that
    creates the same tables on MySQL/MariaDB (``initdb`` applies it after the kernel's
    schema.sql); both create only what is missing."""

    models: tuple
    schema_sql: str


class CreateField(NamedTuple):
    """A feature's own optional field of the create body (a job's ``webhookUrl``, say). The
    kernel accepts it only while the feature is installed; when a client gives it (not null):
    ``check(user_id, value)`` runs with the request's checks, before anything is written, and
    raises a public error to refuse the create; ``write(user_id, job_id, value)`` runs inside
    the creating transaction; and the value is part of the idempotency fingerprint (a request
    without it keeps the fingerprint it had). ``schema``: its property in the OpenAPI schema of
    the create body."""

    name: str
    check: Any
    write: Any
    schema: dict


class Kernel(NamedTuple):
    """What an extension may build on: the kernel's parts, built before any extension."""

    config: Any
    store: Any
    ai: Any  # execution.services.AiServices: gateway, pricing, prompts, credentials
    registry: Any  # the job definitions, plugins loaded
    outbox: Any
    instance_id: str  # this process's name, unique across hosts and restarts (claims carry it)
    redis: Any  # the queue's Redis client (built at first use), or None on the embedded default


class Hooks:
    """The named hook points. Each is a list the extensions fill while they install, in the
    order of the installed tuple, and the kernel reads as it runs."""

    def __init__(self):
        # providers.CallGuard objects held around every provider call; the first runs first.
        self.call_guards = []
        # check(user_id, job_type), run before a create is written: raises a public error
        # (BudgetExceededError, say) to refuse it, nothing written.
        self.create_checks = []
        # (name, step): run at the start of every reaper pass, before its hand-overs; step()
        # returns how many rows it released (a dead worker's budget reservations, say).
        self.reaper_steps = []
        # (name, interval_s, step): run by the holder of the leader lease every interval_s;
        # step(leading) may ask leading() between long parts whether the lease is still held.
        self.leader_steps = []
        # (name, purge): run by every purge pass until it returns 0; purge(limit) deletes at
        # most ``limit`` rows nobody needs any more and returns how many it deleted.
        self.purge_steps = []
        # Tables: each feature's own tables, created with the kernel's by create_schema.
        self.tables = []
        # CreateField: the create body's extra fields, accepted, checked, written with the job
        # and fingerprinted by the service; after the kernel's fields, in this order.
        self.create_fields = []
        # handle(events): the claimed terminal outbox events (ai.job.succeeded, failed,
        # cancelled) handed over in the transaction that marks them published (the webhooks'
        # fan-out); with no handler they are marked published all the same.
        self.terminal_events = []
        # (name, run, wake): a loop on a thread of its own in every worker process (webhook
        # sends, say); run(stop, connection, lead) returns once the threading.Event ``stop`` is
        # set, lead() says whether this process holds the leader lease; wake() is called at
        # stop so that a loop waiting for work sees ``stop`` at once.
        self.worker_loops = []
        # (what, model): tables whose rows only the credential master key can serve (webhook
        # endpoints: their secrets derive from it); web and worker refuse to start without
        # the key while one of them has a row, naming ``what``.
        self.keyed_tables = []
        # make(runtime, access) -> an API resource (engine/http/resources/__init__.py): the
        # feature's routes and OpenAPI fragment, after the kernel's resources, in this order.
        self.http_resources = []


class Extension:
    """A feature installed into a runtime. ``name`` keys its handle in ``Runtime.features``.

    ``settings`` (core.config.Setting), ``together`` (core.config.Together) and ``derive``
    (``step(values, environ)``) are the feature's part of the configuration: engine/extensions.py
    parses them with the kernel's, so a bad value stops start-up with one line like any other."""

    name = ''
    settings = ()
    together = ()
    derive = ()

    def install(self, kernel, hooks, features):
        """Build the feature from ``kernel`` (a Kernel) and register its parts at ``hooks``;
        ``features`` holds the handles of the extensions installed before this one, by name.
        Returns the feature's handle (what the API or a later extension reads), or None when
        the configuration leaves the feature off."""
        raise NotImplementedError
