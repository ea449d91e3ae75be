"""How budgets in money join a runtime."""

import functools

from ...core.extension import Extension
from .dashboard import budgets_panel
from .guard import BudgetGuard
from .ledger import Budgets
from .models import TABLES
from .routes import BudgetRoutes


class BudgetsExtension(Extension):
    """Budgets in money: the BudgetGuard around every call, the create-time refusal of a spent
    budget, and the reaper's release of a dead worker's reservations. Its handle, the Budgets
    ledger, is what the admin API and the batches read."""

    name = 'budgets'

    def install(self, kernel, hooks, features):
        hooks.tables.append(TABLES)
        budgets = Budgets(kernel.store)
        config = kernel.config
        hooks.call_guards.append(BudgetGuard(budgets, kernel.ai.pricing, config.budget_max_tokens))
        hooks.create_checks.append(budgets.check_creatable)
        release = functools.partial(budgets.release_leaked, config.reap_after_ms)
        hooks.reaper_steps.append(('reservations_released', release))
        hooks.http_resources.append(BudgetRoutes)
        hooks.dashboard_panels.append(budgets_panel(budgets))
        return budgets
