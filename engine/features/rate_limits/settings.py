"""The rate limits feature's settings, parsed with the kernel's at start-up
(engine/extensions.py, load_config)."""

from ...core.config import Setting, positive_int

SETTINGS = (
    Setting(
        'AIJOB_RATE_LIMIT_WINDOW_MS',
        '60000',
        positive_int,
        'The window "per minute" of rpm and tpm counts over (the provider\'s).',
    ),
)
