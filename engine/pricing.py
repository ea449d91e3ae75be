"""The cost of a provider call (AiCostCalculatorService) from a configurable price table.

``AIJOB_PRICE_TABLE`` is JSON keyed by model (``"*"`` is the fallback), prices as decimal strings
per ``per`` tokens (default one million), e.g.
``{"deepseek-chat": {"prompt": "0.27", "completion": "1.10", "per": 1000000}}``.
"""
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from .providers import CostCalculator

COST_PLACES = Decimal('0.000001')       # ai_usage_log.cost is DECIMAL(14, 6)


@dataclass(frozen=True)
class Price:
    prompt: Decimal
    completion: Decimal
    per: int = 1_000_000


def parse_price_table(text):
    """{model: Price} from the JSON text; raises ValueError naming what is wrong."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('the price table is not valid JSON') from None
    if not isinstance(raw, dict):
        raise ValueError('the price table must be a JSON object keyed by model')
    return {model: _parse_price(model, entry) for model, entry in raw.items()}


def _parse_price(model, entry):
    if not isinstance(entry, dict) or set(entry) - {'prompt', 'completion', 'per'}:
        raise ValueError('%s: expected {"prompt", "completion", "per"}' % model)
    try:
        # str() first: a JSON float such as 0.1 must not carry its binary rounding into money
        prompt = Decimal(str(entry.get('prompt', 0)))
        completion = Decimal(str(entry.get('completion', 0)))
    except InvalidOperation:
        raise ValueError('%s: prices must be decimal numbers' % model) from None
    per = entry.get('per', 1_000_000)
    if prompt < 0 or completion < 0 or not isinstance(per, int) or per <= 0:
        raise ValueError('%s: prices must be >= 0 and "per" a whole number above 0' % model)
    return Price(prompt, completion, per)


class PriceTableCostCalculator(CostCalculator):
    def __init__(self, table):
        self._table = dict(table)

    @classmethod
    def from_text(cls, text):
        return cls(parse_price_table(text))

    def cost(self, provider_key, model, usage):
        """Decimal cost of one call; a model missing from the table (and no ``*``) costs 0."""
        price = self._table.get(model) or self._table.get('*')
        if price is None:
            return Decimal('0')
        total = (price.prompt * usage.prompt_tokens
                 + price.completion * usage.completion_tokens) / price.per
        return total.quantize(COST_PLACES)
