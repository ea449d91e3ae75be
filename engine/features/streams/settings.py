"""The live text and event streams' settings, parsed with the kernel's at start-up
(engine/extensions.py, load_config)."""

from ...core.config import Setting, Together, positive_int

SETTINGS = (
    Setting(
        'AIJOB_STREAM_MAX_S',
        '300',
        positive_int,
        'Longest a GET /api/ai/jobs/{id}/stream stays open; the client reconnects with '
        'Last-Event-ID.',
    ),
    Setting(
        'AIJOB_STREAM_HEARTBEAT_MS',
        '15000',
        positive_int,
        'An idle job event stream gets a comment line this often, so proxies keep it open.',
    ),
    Setting(
        'AIJOB_MAX_STREAMS',
        '1000',
        positive_int,
        'Most job event streams one web process holds at once (429 TOO_MANY_STREAMS beyond).',
    ),
    Setting(
        'AIJOB_MAX_STREAMS_PER_USER',
        '20',
        positive_int,
        'Most job event streams of one user that one web process holds at once '
        '(429 TOO_MANY_STREAMS beyond).',
    ),
    Setting(
        'AIJOB_STREAM_TEXT_TTL_MS',
        '600000',
        positive_int,
        "The live text of a running job (the stream's delta events) is kept this long after its "
        'last piece (a Redis stream per job, or in the process), for clients that reconnect.',
    ),
    Setting(
        'AIJOB_STREAM_TEXT_MAX_MESSAGES',
        '4000',
        positive_int,
        'Most delta messages of one job kept for reconnecting clients (the oldest go first).',
    ),
)

TOGETHER = (
    Together(
        'AIJOB_STREAM_HEARTBEAT_MS',
        'AIJOB_STREAM_MAX_S',
        'an idle event stream would end before its first heartbeat',
        scale=1000,
    ),
)
