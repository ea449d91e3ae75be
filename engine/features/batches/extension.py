"""How provider batches join a runtime."""

from ...core.extension import Extension
from . import items
from .dashboard import PAGES
from .guard import BatchGuard
from .models import TABLES
from .routes import BatchRoutes, batch_gauges
from .runner import BatchRunner, opted_in
from .settings import SETTINGS, TOGETHER


class BatchesExtension(Extension):
    """Provider batches, when the gateway is routed (AIJOB_PROVIDERS or the shorthand) and a
    definition or a route entry opts in: the BatchGuard among the call guards, the runner's
    step on the housekeeping leader every AIJOB_BATCH_INTERVAL_MS. A billed line of a cancelled
    job is spent against the budgets, when installed."""

    name = 'batches'
    settings = SETTINGS
    together = TOGETHER

    def install(self, kernel, hooks, features):
        # The tables, the operators' list and pages, whether or not anything opts in (empty).
        hooks.tables.append(TABLES)
        hooks.http_resources.append(BatchRoutes)
        hooks.dashboard_panels.extend(PAGES)
        hooks.gauges.append(batch_gauges)  # zeros when nothing opts in
        gateway = features.get('gateway')  # the routed gateway's handle, None unconfigured
        table = gateway.table if gateway is not None else None
        if table is None or not opted_in(kernel.registry, table):
            return None
        config, budgets = kernel.config, features.get('budgets')
        hooks.call_guards.append(BatchGuard(kernel.store, table))
        runner = BatchRunner(kernel.store, kernel.outbox, table, kernel.ai.pricing, config, budgets)
        hooks.leader_steps.append(('batches', config.batch_interval_ms / 1000.0, runner.step))
        if budgets is not None:
            # A parked call keeps its budget reservation until its line is answered and used.
            budgets.hold_calls(HOLDS_RESERVATION)
        return runner


HOLDS_RESERVATION = (
    'EXISTS (SELECT 1 FROM ai_provider_batch_item i WHERE i.job_id = r.job_id AND i.state IN (%s))'
    % ', '.join("'%s'" % state for state in items.OPEN_STATES)
)
