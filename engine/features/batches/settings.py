"""The provider batches feature's settings, parsed with the kernel's at start-up
(engine/extensions.py, load_config)."""

from ...core.config import Setting, Together, positive_int

SETTINGS = (
    Setting(
        'AIJOB_BATCH_INTERVAL_MS',
        '1000',
        positive_int,
        'How often the housekeeping leader forms, submits and polls provider batches.',
    ),
    Setting(
        'AIJOB_BATCH_POLL_FIRST_MS',
        '2000',
        positive_int,
        'The first wait before a submitted provider batch is polled; it doubles at each poll.',
    ),
    Setting(
        'AIJOB_BATCH_POLL_MAX_MS',
        '300000',
        positive_int,
        'The longest wait between two polls of a provider batch.',
    ),
    Setting(
        'AIJOB_BATCH_RESULT_CHUNK',
        '200',
        positive_int,
        'Lines of a finished provider batch written per transaction.',
    ),
)

TOGETHER = (
    Together(
        'AIJOB_BATCH_POLL_FIRST_MS',
        'AIJOB_BATCH_POLL_MAX_MS',
        "a batch's first wait would be longer than the longest",
        or_equal=True,
    ),
)
