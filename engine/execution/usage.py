"""Usage and cost: the price of a provider call (AiCostCalculatorService), one ``ai_usage_log``
row per provider call (failed calls included), and the admin totals per user or per job type
over a time range.

Prices come from the provider config only (AIJOB_PROVIDERS' models' ``price``; the gateway puts
them in the hook point ``prices`` that ``Pricing`` reads): a call nothing prices costs 0.

A call's cost is computed here only: ``call_cost`` (a price and the call's token counts) for the
usage row, the metrics and the budgets' settlement, ``max_call_cost`` (a price, the prompt's token
bound and max_tokens) for what budgets reserve before the call.
"""

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Optional

from peewee import fn

from ..core.models import AiUsageLog
from ..core.sql import insert_row

COST_PLACES = Decimal('0.000001')  # ai_usage_log.cost is DECIMAL(14, 6)
# What a provider's batch API charges of its online price when the price names no ``batch``:
# OpenAI, Azure OpenAI and the compatible hosts that offer batches charge half.
DEFAULT_BATCH_FACTOR = Decimal('0.5')


PRICE_FIELDS = {'prompt', 'completion', 'cachedPrompt', 'batch', 'per'}


@dataclass(frozen=True)
class Price:
    """Prices per ``per`` tokens. ``cached_prompt``: a prompt token the provider served from its
    prompt cache (None: the prompt price). ``batch``: the factor of the whole cost of a call the
    provider billed at its batch rate (``Usage.batch``; None: DEFAULT_BATCH_FACTOR)."""

    prompt: Decimal
    completion: Decimal
    per: int = 1_000_000
    cached_prompt: Optional[Decimal] = None
    batch: Optional[Decimal] = None


# ---------------------------------------------------------------- a call's cost, computed here only
def call_cost(price, usage):
    """The Decimal cost of a provider call that used ``usage`` (providers.Usage) at ``price`` (a
    Price; None: nothing prices the call, it costs 0), rounded to the stored places. The usage
    row, the metrics, a provider batch's lines and budgets' settlements all take it from here."""
    if price is None:
        return Decimal('0')
    cached = min(getattr(usage, 'cached_prompt_tokens', 0) or 0, usage.prompt_tokens)
    total = _cost(price, usage.prompt_tokens - cached, cached, usage.completion_tokens)
    if getattr(usage, 'batch', False):
        total *= DEFAULT_BATCH_FACTOR if price.batch is None else price.batch
    return total.quantize(COST_PLACES)


def max_call_cost(price, prompt_token_bound, max_tokens):
    """The most a call can cost at ``price`` (None: 0): ``prompt_token_bound`` prompt tokens, none
    of them from the provider's prompt cache, and ``max_tokens`` completion tokens at the online
    price. Not rounded: budgets round it up, so a reservation never under-counts."""
    if price is None:
        return Decimal('0')
    return _cost(price, prompt_token_bound, 0, max_tokens)


def _cost(price, prompt_tokens, cached_prompt_tokens, completion_tokens):
    cached_price = price.prompt if price.cached_prompt is None else price.cached_prompt
    return (
        price.prompt * prompt_tokens
        + cached_price * cached_prompt_tokens
        + price.completion * completion_tokens
    ) / price.per


def parse_price(name, entry):
    """A Price from ``{"prompt", "completion", "cachedPrompt"?, "batch"?, "per"?}``; raises
    ValueError starting with ``name``."""
    if not isinstance(entry, dict) or set(entry) - PRICE_FIELDS:
        raise ValueError(
            '%s: expected {"prompt", "completion", "cachedPrompt", "batch", "per"}' % name
        )
    prompt = _decimal(name, entry.get('prompt', 0))
    completion = _decimal(name, entry.get('completion', 0))
    cached = _decimal(name, entry['cachedPrompt']) if 'cachedPrompt' in entry else None
    batch = _decimal(name, entry['batch']) if 'batch' in entry else None
    per = entry.get('per', 1_000_000)
    if not isinstance(per, int) or isinstance(per, bool) or per <= 0:
        raise ValueError('%s: "per" must be a whole number above 0' % name)
    return Price(prompt, completion, per, cached, batch)


def _decimal(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError('%s: prices must be decimal numbers' % name)
    try:
        # str() first: a JSON float such as 0.1 must not carry its binary rounding into money
        number = Decimal(str(value))
    except InvalidOperation:
        raise ValueError('%s: prices must be decimal numbers' % name) from None
    if not number.is_finite() or number < 0:
        raise ValueError('%s: prices must be >= 0' % name)
    return number


class Pricing:
    """The cost of one provider call: the price the provider config gives its provider and model
    (``entries``: {(provider, model): Price}); a call nothing prices costs 0."""

    def __init__(self, entries=None):
        # The hook point ``prices`` (core/extension.py) when a runtime builds it: read at each
        # call, so the prices an extension installs hold from its install on.
        self._entries = {} if entries is None else entries

    def price(self, provider_key, model):
        """The Price of a call to ``provider_key``/``model``, or None when nothing prices it."""
        return self._entries.get((provider_key, model))

    def cost(self, provider_key, model, usage):
        """Decimal cost of one call; a call nothing prices costs 0."""
        return call_cost(self.price(provider_key, model), usage)


# ---------------------------------------------------------------- usage rows and totals
GROUPS = {'user': ('userId', AiUsageLog.user_id), 'job_type': ('jobType', AiUsageLog.job_type)}


INSERT_USAGE = (
    'INSERT INTO ai_usage_log (job_id, user_id, job_type, attempt_no, call_no, credential_mode, '
    'provider, model, prompt_tokens, completion_tokens, cost, latency_ms, error_code, cached, '
    'batch_id, created_at) VALUES '
)
USAGE_ROW = '(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {now})'


def record_usage(
    job, call_no, provider, model, usage, cost, latency_ms, error_code=None, cached=False
):
    """Write the row for provider call ``call_no`` of ``job``, made in its attempt
    ``job.attempt_no``; ``usage`` is a providers.Usage; ``cached``: the response cache answered
    the call (its tokens are the cached answer's, its cost 0); ``usage.batch_id``: a provider
    batch answered it (engine/features/batches/). Runs on
    the caller's connection, inside its transaction if it has one (the engine writes the row
    of a successful call in the PROJECT transaction)."""
    insert_row(
        INSERT_USAGE,
        USAGE_ROW,
        (
            job.id,
            job.user_id,
            job.job_type,
            job.attempt_no,
            call_no,
            job.credential_mode,
            provider,
            model or '',
            usage.prompt_tokens,
            usage.completion_tokens,
            AiUsageLog.cost.db_value(cost),
            int(latency_ms),
            error_code,
            bool(cached),
            getattr(usage, 'batch_id', None),
        ),
    )


def usage_totals(since, until, group_by='user'):
    """Totals of calls in [since, until) (naive UTC datetimes) per user or per job type:
    ``[{"userId"|"jobType", calls, promptTokens, completionTokens, cost, errors}]``, the
    costliest first; ``cost`` is a decimal string."""
    if group_by not in GROUPS:
        raise ValueError('group_by must be one of %s' % ', '.join(GROUPS))
    name, column = GROUPS[group_by]
    query = (
        AiUsageLog.select(
            column.alias('group_key'),
            fn.COUNT(AiUsageLog.id).alias('calls'),
            fn.SUM(AiUsageLog.prompt_tokens).alias('prompt_tokens'),
            fn.SUM(AiUsageLog.completion_tokens).alias('completion_tokens'),
            fn.SUM(AiUsageLog.cost).alias('cost'),
            fn.COUNT(AiUsageLog.error_code).alias('errors'),
        )
        .where((AiUsageLog.created_at >= since) & (AiUsageLog.created_at < until))
        .group_by(column)
        .dicts()
    )
    rows = [_total(name, row) for row in query]
    return sorted(rows, key=lambda r: (-Decimal(r['cost']), r[name]))


def _total(name, row):
    # SQLite sums DECIMAL columns as floats; str() then quantize gives back the stored cents.
    cost = Decimal(str(row['cost'] or 0)).quantize(COST_PLACES)
    return {
        name: row['group_key'],
        'calls': int(row['calls']),
        'promptTokens': int(row['prompt_tokens'] or 0),
        'completionTokens': int(row['completion_tokens'] or 0),
        'cost': str(cost),
        'errors': int(row['errors']),
    }
