"""``AIJOB_PROVIDERS``: named OpenAI-compatible providers, their models and the routes between
them, checked once at start-up (docs/architecture.md, decision 17).

    {"providers": {"deepseek": {"baseUrl": "https://api.deepseek.com",
                                "apiKeyEnv": "DEEPSEEK_API_KEY", "readTimeoutMs": 60000,
                                "models": {"deepseek-chat": {
                                    "price": {"prompt": "0.27", "completion": "1.10",
                                              "cachedPrompt": "0.07", "per": 1000000},
                                    "limits": {"rpm": 600, "tpm": 1000000},
                                    "context": 65536, "maxTokens": 4096,
                                    "batch": {"maxWaitMs": 600000, "maxJobs": 500}}}}},
     "routes": {"default": ["deepseek/deepseek-chat", "openrouter/deepseek/deepseek-chat"]}}

A provider names the *environment variable* that holds its key (``apiKeyEnv``), never the key:
the file can be committed and shown. A route entry is ``provider/model``, split at the first
slash (OpenRouter's model names have slashes of their own). A provider without ``baseUrl`` is a
plugin's own (the offline ``synthetic``): the file only prices and limits its models (``price``,
``limits``), it is never routed. Prices and rate limits come from this file only.

Without AIJOB_PROVIDERS, ``AIJOB_PROVIDER_BASE_URL``/``AIJOB_PROVIDER_MODEL`` (the one-provider
shorthand) are written as this file's JSON, one provider ``openai`` whose key is
AIJOB_PLATFORM_API_KEY, and parsed by the same ``parse``: the same config, no price, no limit
(a one-provider setup that needs either writes AIJOB_PROVIDERS).

A model's ``batch`` sends the ``ai-background`` jobs routed to it through the provider's batch
API (engine/features/batches/); it wins over a definition's own ``batch``, since the operator
knows which providers offer the batch API and how their batches are best sized.

Every error is a ConfigError of one line that names the entry at fault.
"""

import re
from dataclasses import dataclass, field, replace
from typing import Optional
from urllib.parse import urlsplit

from ...core.errors import ConfigError, InvalidDefinitionError
from ...core.registry import BatchPolicy, validate_batch_policy
from ...execution.usage import parse_price

SETTING = 'AIJOB_PROVIDERS'
SHORTHAND = 'AIJOB_PROVIDER_BASE_URL'
SHORTHAND_PROVIDER = 'openai'  # the provider key of the one-provider shorthand (and of old rows)
SHORTHAND_KEY_ENV = 'AIJOB_PLATFORM_API_KEY'
DEFAULT_ROUTE = 'default'
NAME_PATTERN = re.compile(r'^[a-z][a-z0-9_.-]{0,63}$')  # providers and routes
ENV_PATTERN = re.compile(r'^[A-Za-z_][A-Za-z0-9_]{0,127}$')
MAX_MODEL_CHARS = 128  # ai_usage_log.model
PROVIDER_FIELDS = {'baseUrl', 'apiKeyEnv', 'readTimeoutMs', 'models'}
MODEL_FIELDS = {'price', 'limits', 'context', 'maxTokens', 'batch'}
# A plugin's own provider (no baseUrl): the file prices and limits it, nothing else.
PLUGIN_PROVIDER_FIELDS = {'models'}
PLUGIN_MODEL_FIELDS = {'price', 'limits'}
BATCH_FIELDS = {'maxWaitMs', 'maxJobs'}
LIMIT_FIELDS = {'rpm', 'tpm'}


@dataclass(frozen=True)
class Limits:
    """A provider/model's rate limits: requests and tokens per window (AIJOB_RATE_LIMIT_WINDOW_MS,
    a minute by default; None: no limit of that kind)."""

    rpm: Optional[int] = None
    tpm: Optional[int] = None

    def __bool__(self):
        return bool(self.rpm or self.tpm)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    price: object = None  # usage.Price, or None (its calls cost 0)
    limits: Optional[Limits] = None
    context: Optional[int] = None  # the context window in tokens, when known
    max_tokens: Optional[int] = None  # the completion cap sent with each request
    batch: Optional[BatchPolicy] = None  # its background jobs go through the batch API


@dataclass(frozen=True)
class ProviderSpec:
    name: str
    base_url: Optional[str]  # None: a plugin's own provider, priced and limited, never routed
    api_key_env: Optional[str]  # None: the provider takes no key (a local server)
    read_timeout_ms: int
    models: dict  # name -> ModelSpec, in file order

    @property
    def routed(self):
        return self.base_url is not None


@dataclass(frozen=True)
class Entry:
    """One step of a route: a provider and one of its models."""

    provider: str
    model: str

    @property
    def key(self):
        return '%s/%s' % (self.provider, self.model)


@dataclass(frozen=True)
class ProvidersConfig:
    providers: dict  # name -> ProviderSpec
    routes: dict  # name -> tuple of Entry
    default_route: Optional[str]  # None: no routed provider (only plugins' are priced)
    source: str = SETTING  # the setting it came from (SHORTHAND for the old one)
    keys: dict = field(default_factory=dict, repr=False)  # provider -> its key, or None

    def model(self, entry):
        return self.providers[entry.provider].models[entry.model]

    def entries(self):
        """Every routed provider/model, in file order."""
        return [Entry(p.name, m) for p in self.routed() for m in p.models]

    def routed(self):
        """The OpenAI-compatible providers (those with a baseUrl), in file order."""
        return [spec for spec in self.providers.values() if spec.routed]

    def prices(self):
        """{(provider, model): Price} of every model that sets a price."""
        return {
            (spec.name, model.name): model.price
            for spec in self.providers.values()
            for model in spec.models.values()
            if model.price is not None
        }

    def limits(self):
        """{'provider/model': Limits} of every model that sets limits."""
        return {
            '%s/%s' % (spec.name, model.name): model.limits
            for spec in self.providers.values()
            for model in spec.models.values()
            if model.limits is not None
        }

    def key_of(self, provider):
        return self.keys.get(provider)

    def needs_key(self, provider):
        return self.providers[provider].api_key_env is not None


def load(config):
    """The ProvidersConfig of ``config`` (AIJOB_PROVIDERS, else the shorthand), or None when no
    OpenAI-compatible provider is configured. Both set is refused: the shorthand would be
    believed to add a provider the file does not have."""
    if config.providers is not None:
        if config.provider_base_url:
            raise ConfigError(
                '%s is set with %s, which replaces it: name that provider in %s (or unset %s)'
                % (SHORTHAND, SETTING, SETTING, SHORTHAND)
            )
        return parse(config.providers, config.provider_read_timeout_ms, _keys(config))
    if config.provider_base_url:
        return shorthand(config)
    return None


def _keys(config):
    return dict(getattr(config, 'provider_keys', None) or {})


def shorthand(config):
    """``AIJOB_PROVIDER_BASE_URL`` and ``AIJOB_PROVIDER_MODEL`` as the AIJOB_PROVIDERS they
    stand for: one provider, ``openai``, one model, its key in AIJOB_PLATFORM_API_KEY; parsed
    like the file, so the two cannot say different things."""
    raw = {
        'providers': {
            SHORTHAND_PROVIDER: {
                'baseUrl': config.provider_base_url,
                'apiKeyEnv': SHORTHAND_KEY_ENV,
                'readTimeoutMs': config.provider_read_timeout_ms,
                'models': {config.provider_model: {}},
            }
        }
    }
    table = parse(raw, env_keys={SHORTHAND_KEY_ENV: config.platform_api_key or None})
    return replace(table, source=SHORTHAND)


def parse(raw, default_read_timeout_ms=60000, env_keys=None):
    """A ProvidersConfig from the parsed JSON of AIJOB_PROVIDERS; ``env_keys`` maps each
    ``apiKeyEnv`` to its value. Raises ConfigError naming the entry."""
    _expect(isinstance(raw, dict), '', 'expected a JSON object')
    _fields(raw, {'providers', 'routes'}, '')
    providers_raw = raw.get('providers')
    _expect(
        isinstance(providers_raw, dict) and providers_raw,
        'providers',
        'expected an object naming at least one provider',
    )
    providers = {
        name: _provider(name, entry, default_read_timeout_ms)
        for name, entry in providers_raw.items()
    }
    routes = _routes(raw.get('routes'), providers)
    env_keys = env_keys or {}
    keys = {
        name: env_keys.get(spec.api_key_env) if spec.api_key_env else None
        for name, spec in providers.items()
    }
    default = DEFAULT_ROUTE if DEFAULT_ROUTE in routes else next(iter(routes), None)
    return ProvidersConfig(providers, routes, default, keys=keys)


def _provider(name, entry, default_read_timeout_ms):
    where = 'providers.%s' % name
    _expect(bool(NAME_PATTERN.match(name)), where, 'a provider name is 1-64 of a-z 0-9 _ . -')
    _expect(isinstance(entry, dict), where, 'expected an object')
    if 'apiKey' in entry or 'key' in entry:
        _fail(where, 'a key never goes in this file: name its environment variable in apiKeyEnv')
    if entry.get('baseUrl') is None:
        return _plugin_provider(where, name, entry)
    _fields(entry, PROVIDER_FIELDS, where)
    base_url = entry.get('baseUrl')
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    _expect(
        parts is not None and parts.scheme in ('http', 'https') and bool(parts.hostname),
        where + '.baseUrl',
        'expected http(s)://HOST[:PORT]/PATH',
    )
    key_env = entry.get('apiKeyEnv')
    _expect(
        key_env is None or (isinstance(key_env, str) and bool(ENV_PATTERN.match(key_env))),
        where + '.apiKeyEnv',
        'expected the name of an environment variable',
    )
    timeout = entry.get('readTimeoutMs', default_read_timeout_ms)
    _expect(_positive(timeout), where + '.readTimeoutMs', 'expected milliseconds above 0')
    return ProviderSpec(name, base_url.rstrip('/'), key_env, timeout, _models(where, entry))


def _plugin_provider(where, name, entry):
    """A provider without baseUrl: a plugin's own (the synthetic one), whose models' prices and
    limits the file gives; it has no key, no timeout and no route of the file's."""
    _fields(entry, PLUGIN_PROVIDER_FIELDS, where)
    models = _models(where, entry)
    for model, raw in entry['models'].items():
        _fields(raw, PLUGIN_MODEL_FIELDS, '%s.models.%s' % (where, model))
    return ProviderSpec(name, None, None, 0, models)


def _models(where, entry):
    models_raw = entry.get('models')
    _expect(
        isinstance(models_raw, dict) and models_raw,
        where + '.models',
        'expected an object naming at least one model',
    )
    return {
        model: _model('%s.models.%s' % (where, model), model, m) for model, m in models_raw.items()
    }


def _model(where, name, entry):
    _expect(
        isinstance(name, str) and 0 < len(name) <= MAX_MODEL_CHARS and name.strip() == name,
        where,
        'a model name is 1-%d characters without surrounding spaces' % MAX_MODEL_CHARS,
    )
    _expect(isinstance(entry, dict), where, 'expected an object')
    _fields(entry, MODEL_FIELDS, where)
    price = None
    if entry.get('price') is not None:
        try:
            price = parse_price(where + '.price', entry['price'])
        except ValueError as exc:
            raise ConfigError('%s is invalid: %s' % (SETTING, exc)) from None
    limits = None
    if entry.get('limits') is not None:
        raw = entry['limits']
        _expect(isinstance(raw, dict), where + '.limits', 'expected {"rpm", "tpm"}')
        _fields(raw, LIMIT_FIELDS, where + '.limits')
        for kind in LIMIT_FIELDS & set(raw):
            _expect(
                _positive(raw[kind]), '%s.limits.%s' % (where, kind), 'expected a count above 0'
            )
        limits = Limits(raw.get('rpm'), raw.get('tpm'))
    context, max_tokens = entry.get('context'), entry.get('maxTokens')
    _expect(context is None or _positive(context), where + '.context', 'expected tokens above 0')
    _expect(
        max_tokens is None or _positive(max_tokens), where + '.maxTokens', 'expected tokens above 0'
    )
    _expect(
        context is None or max_tokens is None or max_tokens < context,
        where + '.maxTokens',
        'must be below the context (%s)' % context,
    )
    return ModelSpec(name, price, limits, context, max_tokens, _batch(where, entry.get('batch')))


def _batch(where, raw):
    if raw is None:
        return None
    where += '.batch'
    _expect(isinstance(raw, dict), where, 'expected {"maxWaitMs", "maxJobs"}')
    _fields(raw, BATCH_FIELDS, where)
    policy = BatchPolicy(raw.get('maxWaitMs'), raw.get('maxJobs'))
    try:
        validate_batch_policy(where, policy)
    except InvalidDefinitionError as exc:
        _fail(where, str(exc).split(': ', 1)[1])
    return policy


def _routes(raw, providers):
    """The routes; without any, one route ``default`` of every routed model in file order (none
    when only plugins' providers are listed)."""
    if raw is None or raw == {}:
        entries = tuple(Entry(p.name, m) for p in providers.values() if p.routed for m in p.models)
        return {DEFAULT_ROUTE: entries} if entries else {}
    _expect(isinstance(raw, dict), 'routes', 'expected an object of route name -> entries')
    routes = {}
    for name, chain in raw.items():
        where = 'routes.%s' % name
        _expect(bool(NAME_PATTERN.match(name)), where, 'a route name is 1-64 of a-z 0-9 _ . -')
        _expect(
            isinstance(chain, list) and chain,
            where,
            'expected a non-empty array of "provider/model"',
        )
        entries = []
        for i, text in enumerate(chain):
            entry = _entry('%s[%d]' % (where, i), text, providers)
            _expect(entry not in entries, '%s[%d]' % (where, i), '%s is listed twice' % text)
            entries.append(entry)
        routes[name] = tuple(entries)
    return routes


def _entry(where, text, providers):
    _expect(isinstance(text, str) and '/' in text, where, 'expected "provider/model"')
    provider, model = text.split('/', 1)
    _expect(provider in providers, where, 'no provider %r in providers' % provider)
    _expect(
        providers[provider].routed,
        where,
        "provider %s has no baseUrl: a plugin's provider is priced here, never routed" % provider,
    )
    _expect(
        model in providers[provider].models,
        where,
        'provider %s has no model %r' % (provider, model),
    )
    return Entry(provider, model)


def _fields(entry, allowed, where):
    unknown = sorted(set(entry) - allowed)
    if unknown:
        _fail(
            '%s.%s' % (where, unknown[0]) if where else unknown[0],
            'unknown field (expected %s)' % ', '.join(sorted(allowed)),
        )


def _positive(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _expect(condition, where, message):
    if not condition:
        _fail(where, message)


def _fail(where, message):
    raise ConfigError('%s is invalid: %s: %s' % (SETTING, where or '(top level)', message))
