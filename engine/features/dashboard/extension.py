"""How the operators' dashboard joins a runtime."""

import os

from ...core.extension import Extension, Tables
from .models import MODELS
from .routes import PREFIX, Dashboard
from .settings import SETTINGS

SCHEMA_SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema.sql')


class DashboardExtension(Extension):
    """The dashboard: its sessions' table, and its pages among the API's resources. The panels
    and pages other features registered (``hooks.dashboard_panels``) are read when the app is
    built, after every extension installed."""

    name = 'dashboard'
    settings = SETTINGS

    def install(self, kernel, hooks, features):
        hooks.tables.append(Tables(MODELS, SCHEMA_SQL))
        hooks.http_resources.append(Dashboard)
        return PREFIX  # where it is served
