"""AIJOB_PROVIDERS for tests, the one place prices and rate limits are said: a one-provider
config (what the shorthand AIJOB_PROVIDER_BASE_URL stands for, plus a price or limits), or the
prices and limits of a plugin's own provider (synthetic)."""

import json


def one_provider(base_url, model='fake-model', price=None, limits=None):
    """The settings of the shorthand's provider (``openai``, its key in AIJOB_PLATFORM_API_KEY)
    with its model's ``price`` and ``limits`` (the file's JSON objects; None: none)."""
    entry = _model(price, limits)
    provider = {
        'baseUrl': base_url,
        'apiKeyEnv': 'AIJOB_PLATFORM_API_KEY',
        'models': {model: entry},
    }
    return {'AIJOB_PROVIDERS': json.dumps({'providers': {'openai': provider}})}


def plugin_provider(price=None, limits=None, provider='synthetic', model='synthetic-1'):
    """The settings that price and limit a plugin's own provider (no baseUrl: never routed)."""
    entry = _model(price, limits)
    return {'AIJOB_PROVIDERS': json.dumps({'providers': {provider: {'models': {model: entry}}}})}


def _model(price, limits):
    entry = {}
    if price is not None:
        entry['price'] = price
    if limits is not None:
        entry['limits'] = limits
    return entry
