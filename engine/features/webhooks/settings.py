"""The webhooks' settings, parsed with the kernel's at start-up (engine/extensions.py,
load_config). The signing secrets come from the kernel's AIJOB_CREDENTIAL_MASTER_KEY."""

from ...core.config import Setting, flag, positive_int

SETTINGS = (
    Setting(
        'AIJOB_WEBHOOK_ALLOW_HTTP',
        '0',
        flag,
        '1: webhook URLs may use plain http (local development); 0: https only.',
    ),
    Setting(
        'AIJOB_WEBHOOK_ALLOW_PRIVATE',
        '0',
        flag,
        '1: webhook URLs may resolve to loopback, link-local or private addresses (local '
        'development); 0: refused at registration and at delivery.',
    ),
    Setting(
        'AIJOB_WEBHOOK_TIMEOUT_MS',
        '10000',
        positive_int,
        'A webhook receiver that has not answered within this long fails the attempt.',
    ),
    Setting(
        'AIJOB_WEBHOOK_MAX_ATTEMPTS',
        '8',
        positive_int,
        'Attempts per webhook delivery before it is dead.',
    ),
    Setting(
        'AIJOB_WEBHOOK_RETRY_BASE_MS',
        '5000',
        positive_int,
        'Delay before the first webhook retry; each next one is 5 times longer (with jitter), '
        'so the default 8 attempts span about a day.',
    ),
    Setting(
        'AIJOB_WEBHOOK_CONCURRENCY',
        '8',
        positive_int,
        "Webhook deliveries one worker process sends at once (their own threads, never the jobs').",
    ),
    Setting(
        'AIJOB_WEBHOOK_RETENTION_MS',
        str(7 * 24 * 3600 * 1000),
        positive_int,
        'Delivered and dead webhook deliveries older than this are deleted by the purger.',
    ),
)
