"""The gateway feature's settings, parsed with the kernel's at start-up
(engine/extensions.py, load_config)."""

from ...core.config import (
    Setting,
    http_url_or_empty,
    json_object_or_file,
    non_empty_text,
    positive_int,
)

SETTINGS = (
    Setting(
        'AIJOB_PROVIDER_BASE_URL',
        '',
        http_url_or_empty,
        'OpenAI-compatible API (https://api.deepseek.com, http://127.0.0.1:8080/v1, ...). '
        'Unset: only the offline synthetic provider exists.',
    ),
    Setting(
        'AIJOB_PROVIDER_MODEL',
        'deepseek-chat',
        non_empty_text,
        'Model the OpenAI-compatible provider asks for.',
    ),
    Setting(
        'AIJOB_PROVIDER_READ_TIMEOUT_MS',
        '60000',
        positive_int,
        'A provider connection silent this long (no byte) fails the call PROVIDER_TIMEOUT, '
        'retryable; the job deadline (timeoutMs) bounds every call as well.',
    ),
    Setting(
        'AIJOB_PROVIDERS',
        '',
        json_object_or_file,
        'Named OpenAI-compatible providers, their models (prices, limits, context, maxTokens) '
        'and routes (fallback chains of "provider/model"), as JSON or @PATH to a JSON file; '
        'keys come from the environment variables the file names (README "Providers and '
        'routes"). The only source of prices and rate limits; a provider without baseUrl '
        "prices and limits a plugin's own (synthetic). Unset: AIJOB_PROVIDER_BASE_URL is the "
        'one provider, if set, with no price and no limit.',
    ),
    Setting(
        'AIJOB_COOLDOWN_FAILURES',
        '3',
        positive_int,
        'A provider/model that fails this many calls in a row (timeouts, connection errors, '
        '5xx, 429) within AIJOB_COOLDOWN_WINDOW_MS is skipped by every worker for '
        'AIJOB_COOLDOWN_MS.',
    ),
    Setting(
        'AIJOB_COOLDOWN_WINDOW_MS',
        '60000',
        positive_int,
        'The window in which AIJOB_COOLDOWN_FAILURES failures start a cooldown.',
    ),
    Setting(
        'AIJOB_COOLDOWN_MS',
        '60000',
        positive_int,
        'How long a provider/model is skipped after its failures (a 429 with Retry-After: '
        'that long instead, if longer).',
    ),
    Setting(
        'AIJOB_COOLDOWN_PROBE_MS',
        '2000',
        positive_int,
        'While a provider/model cools down, one call every this long (from any one worker) tries '
        'it: its success ends the cooldown for every worker, its failure keeps it (no probe when '
        'this is not shorter than AIJOB_COOLDOWN_MS).',
    ),
    Setting(
        'AIJOB_BUDGET_MAX_TOKENS',
        '4096',
        positive_int,
        'The max_tokens sent with a call whose route entry sets no maxTokens, and what a budget '
        "reserves for its completion: a call reserves its prompt's bound x prompt price + "
        'this x completion price.',
    ),
)


def provider_keys(providers, environ):
    """The keys of the providers AIJOB_PROVIDERS names, read from the environment variables its
    entries name (``apiKeyEnv``): {variable: key or None}. The file never holds a key."""
    found = {}
    for entry in ((providers or {}).get('providers') or {}).values():
        name = entry.get('apiKeyEnv') if isinstance(entry, dict) else None
        if isinstance(name, str) and name:
            found[name] = environ.get(name) or None
    return found


def provider_keys_from(values, environ):
    """The keys the provider config names, read from the environment at start-up."""
    values['provider_keys'] = provider_keys(values['providers'], environ)
