"""``python aijob.py providers [--check]``: the configured providers, models (context, maxTokens,
limits, prices) and routes, keys masked; with ``--check``, each provider's ``GET /models``."""

from ...core.errors import AiJobError
from ...execution.credentials import mask_key
from .openai_client import OpenAICompatibleProvider
from .providers_config import load

CHECK_TIMEOUT_S = 10.0


def describe(config):
    """The lines to print (no provider configured: one line saying so)."""
    table = load(config)
    if table is None:
        return [
            'no OpenAI-compatible provider is configured (set AIJOB_PROVIDERS, or '
            'AIJOB_PROVIDER_BASE_URL): only the offline synthetic provider exists'
        ]
    lines = ['providers (from %s):' % table.source]
    for spec in table.providers.values():
        lines.append(_provider(table, spec))
        for model in spec.models.values():
            lines.append('    %s  %s' % (model.name, _model(model)))
    if table.default_route is None:
        lines.append('routes: none (no provider has a baseUrl)')
        return lines
    lines.append('routes (default: %s):' % table.default_route)
    for name, entries in table.routes.items():
        lines.append('  %s: %s' % (name, ' -> '.join(entry.key for entry in entries)))
    return lines


def _provider(table, spec):
    if not spec.routed:
        return "  %s  a plugin's own provider: priced and limited here, never routed" % spec.name
    return '  %s  %s  key: %s  read timeout %d ms' % (
        spec.name,
        spec.base_url,
        _key(table, spec),
        spec.read_timeout_ms,
    )


def _key(table, spec):
    """The variable that holds the key and whether it is set, never the key itself."""
    if spec.api_key_env is None:
        return 'none (the provider takes no key)'
    value = table.key_of(spec.name)
    shown = 'set, %s' % mask_key(value) if value else 'NOT SET'
    return '%s (%s)' % (spec.api_key_env, shown)


def _model(model):
    parts = [
        'context %s' % (model.context or '?'),
        'maxTokens %s' % (model.max_tokens or '-'),
        'rpm %s' % (model.limits.rpm if model.limits and model.limits.rpm else '-'),
        'tpm %s' % (model.limits.tpm if model.limits and model.limits.tpm else '-'),
    ]
    price = model.price
    if price is None:
        parts.append('price: none (its calls cost 0)')
    else:
        parts.append(
            'price per %d tokens: prompt %s, completion %s, cached prompt %s, batch %s'
            % (
                price.per,
                price.prompt,
                price.completion,
                '-' if price.cached_prompt is None else price.cached_prompt,
                '-' if price.batch is None else '×%s' % price.batch,
            )
        )
    return '  '.join(parts)


def check(config):
    """(lines, every provider answered): each provider's model list, asked with its key."""
    table = load(config)
    if table is None:
        return describe(config), False
    lines, healthy = [], True
    for spec in table.routed():
        client = OpenAICompatibleProvider(
            spec.base_url, next(iter(spec.models)), key=spec.name, read_timeout_s=CHECK_TIMEOUT_S
        )
        try:
            listed = client.list_models(table.key_of(spec.name), timeout_s=CHECK_TIMEOUT_S)
        except AiJobError as exc:
            healthy = False
            lines.append('%s: failed: %s %s' % (spec.name, exc.code, exc))
            continue
        missing = [m for m in spec.models if m not in listed]
        note = '; not listed: %s' % ', '.join(missing) if missing else ''
        lines.append('%s: ok (%d models listed%s)' % (spec.name, len(listed), note))
    return lines, healthy
