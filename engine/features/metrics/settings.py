"""The metrics feature's settings, parsed with the kernel's at start-up (engine/extensions.py,
load_config)."""

from ...core.config import Setting, non_empty_text, port_or_empty, secret_or_empty

SETTINGS = (
    Setting(
        'AIJOB_METRICS_TOKEN',
        '',
        secret_or_empty,
        'A bearer token that may read GET /metrics (besides admin tokens), for a Prometheus '
        'scrape config. Unset: only admin tokens may.',
        secret=True,
    ),
    Setting(
        'AIJOB_METRICS_PORT',
        '',
        port_or_empty,
        '`worker` serves GET /metrics on this port (same tokens as the API). Unset: no port.',
    ),
    Setting(
        'AIJOB_METRICS_HOST',
        '0.0.0.0',
        non_empty_text,
        "Address the worker's AIJOB_METRICS_PORT listens on.",
    ),
)
