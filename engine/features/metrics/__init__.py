"""Prometheus metrics (README "Metrics"): the kernel's signals counted (counters.py), the scrape
with the gauges read at its time (scrape.py), ``GET /metrics`` (routes.py), the worker's own
port (port.py), where a process's counts live (processes.py). The kernel only signals
(engine/core/signals.py); the features' gauges come through the ``gauges`` hook point."""

USES = ()
