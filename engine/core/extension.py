"""The extension protocol: how a feature joins the kernel (docs/architecture.md, "Extensions").

The kernel (store, lifecycle, registry, service, outbox, dispatcher, queues, workers,
housekeeping, the execution engine, the job API) knows no feature. A feature is an
``Extension``: its ``install`` builds the feature's parts from the kernel's and registers them
at the named hook points of ``Hooks``. The kernel's parts are built with those hook points and
only read them; nothing of the kernel is set from outside after it is built. The installed
extensions are one ordered tuple, ``engine/extensions.py``: that order is the order their call
guards run in, and the order they install in (a feature may use what one before it installed).
Each feature lives in one folder, ``engine/features/<name>/``, which declares in its
``__init__`` the other features it imports (``USES``); tests/project/test_layout.py holds it
to that.
"""

from typing import Any, NamedTuple


class Tables(NamedTuple):
    """A feature's own tables: its peewee models (SQLite creates them) and the DDL file that
    creates the same tables on MySQL/MariaDB (``initdb`` applies it after the kernel's
    schema.sql); both create only what is missing."""

    models: tuple
    schema_sql: str


class DashboardPanel(NamedTuple):
    """A feature's panel on one of the dashboard's own pages (the dashboard feature prints it
    where that page's template has its panels' slot: the usage page's, today)."""

    page: str  # the page it shows on: 'usage'
    template: str  # the path of its bottle SimpleTemplate (a fragment: no rebase)
    read: Any  # read(runtime, query) -> the template's values, a dict; query: {name: value}


class DashboardPage(NamedTuple):
    """A feature's page of its own on the dashboard, with its place in the OpenAPI document.
    The dashboard serves it to a signed-in operator only, with its sign-in, errors and headers."""

    path: str  # under /dashboard, in bottle's syntax: '/batches', '/batches/<batch_id>'
    title: str  # the window's title: 'Batch'
    tab: str  # the navigation bar's entry it belongs to (linked to the first page of that tab)
    template: str  # the path of its bottle SimpleTemplate, which rebases on 'base'
    read: Any  # read(runtime, query, **path values) -> the template's values; may raise a
    # public error (BatchNotFoundError: the 404 page)
    summary: str  # its OpenAPI summary
    errors: tuple = ()  # the statuses it may answer besides 200, 303, 401 and 503 (404, say)


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
    signals: Any  # core.signals.Signals: what the kernel says as it works (a guard may too)


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
        # A feature's gateway over the kernel's (AiServices.providers, the plugins' providers):
        # the last one listed answers the engine's calls (the routed gateway); none: the kernel's.
        self.gateways = []
        # {(provider key, model): usage.Price}: the prices the kernel's Pricing costs calls at
        # (a call nothing prices costs 0).
        self.prices = {}
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
        # Followers of the text running provider calls stream: each has open(job_id) -> a sink
        # (write(text), close()). The engine opens a sink with each around every provider call,
        # the call's CallContext.report_text writes to them, and the engine closes them (a close
        # may wait briefly for its last text to go out) before the call's outcome is written.
        # Empty: the engine opens nothing and report_text does nothing.
        self.live_text = []
        # close(): called by Runtime.close, in this order, once the background loops have
        # stopped and before the queue and the store close (a feature's threads, connections).
        self.closers = []
        # Receivers of the kernel's signals (core/signals.py: jobs created, finished, provider
        # calls, HTTP requests...): the kernel's parts pass each signal to every one, in order.
        self.signal_receivers = []
        # read() -> Prometheus metric families of shared state, read at each scrape (the
        # gateway's cooldowns, the provider batches); the kernel reads none of them: the
        # metrics feature's scrape collects them, the caller holding a store connection.
        self.gauges = []
        # make() -> a context manager that gunicorn's master (engine/server.py: ``serve``,
        # ``web``) enters before it forks its workers and leaves after the last one is gone.
        self.gunicorn_master = []
        # make(runtime) -> a context manager that ``python aijob.py worker`` enters once its
        # runtime is built, before its loops start, and leaves after they stopped.
        self.worker_process = []
        # DashboardPanel and DashboardPage objects: what a feature shows to operators. The
        # kernel does nothing with them; the dashboard feature (engine/features/dashboard/),
        # when installed, serves them in this order, and without it they are never read.
        self.dashboard_panels = []


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
