"""The budgets' panel on the operators' dashboard (engine/features/dashboard/, when installed):
every budget against its current period's spend, on the usage page."""

import os

from ...core.extension import DashboardPanel
from .routes import budget_view

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'templates', 'budgets.tpl')


def budgets_panel(budgets):
    """The panel over ``budgets`` (the ledger, ledger.py)."""

    def read(runtime, query):
        return {'budgets': [budget_view(*listed) for listed in budgets.listing()]}

    return DashboardPanel(page='usage', template=TEMPLATE, read=read)
