"""The dashboard's settings, parsed with the kernel's at start-up (engine/extensions.py,
load_config)."""

from ...core.config import Setting, positive_int

SETTINGS = (
    Setting(
        'AIJOB_DASHBOARD_SESSION_MS',
        '28800000',
        positive_int,
        'How long a dashboard sign-in lasts (from sign-in, by the database clock); then the '
        'operator signs in again with an admin token.',
    ),
)
