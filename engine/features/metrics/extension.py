"""How the metrics join a runtime."""

from ...core.extension import Extension
from .counters import Counting
from .port import worker_process
from .processes import gunicorn_master
from .routes import MetricsRoutes
from .settings import SETTINGS


class MetricsExtension(Extension):
    """Prometheus metrics: the kernel's signals counted, ``GET /metrics`` on the API, the
    gunicorn workers' shared directory of counts, the worker's own port. It has no handle."""

    name = 'metrics'
    settings = SETTINGS

    def install(self, kernel, hooks, features):
        hooks.signal_receivers.append(Counting())
        hooks.http_resources.append(MetricsRoutes)
        hooks.gunicorn_master.append(gunicorn_master)
        hooks.worker_process.append(worker_process)
        return None
