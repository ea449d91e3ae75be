"""Reading a request body as JSON, strictly: what json.loads lets through but nothing after it can
store, hash or give back unchanged is refused here, as 400 INVALID_JSON (or INVALID_REQUEST for
nesting), before anything is written (docs/contracts.md §7.3).

- ``NaN``, ``Infinity``: not JSON at all.
- A number with a fraction or an exponent is an IEEE double (RFC 8259 §6). One whose magnitude is
  beyond the largest double (``1e400``, ``-1e400``) would become infinity, which the canonical
  hash (docs/architecture.md, decision 8) cannot encode; one that is not zero but smaller than
  the smallest double (``1e-400``) would silently become 0. Both are refused.
- An integer is kept exactly, up to MAX_INTEGER_DIGITS digits: the canonical form and the stores
  (JSON text) give it back digit for digit. Past that it is refused, naming the limit.
- An object with the same key twice: parsers disagree on which one wins, so a proxy or a client
  library may have checked another value than the one we would keep.
- A byte order mark before the text (RFC 8259 §8.1: JSON text is UTF-8 without one).
- A lone surrogate escape (``"\\ud800"``): valid JSON, but no UTF-8 text can hold it.
- Nesting deeper than MAX_JSON_DEPTH: the schema validator and the hash recurse.
"""

import json
import math
import re

from ..core.errors import InvalidJsonError, InvalidRequestError

MAX_JSON_DEPTH = 64
MAX_INTEGER_DIGITS = 1000
TOO_DEEP = 'The request body is nested deeper than %d levels.' % MAX_JSON_DEPTH
NOT_FINITE = (
    'A number in the request body is beyond the largest a double holds (about 1.8e308); '
    'send it as a string.'
)
UNDERFLOW = (
    'A number in the request body is too small for a double (under about 5e-324) and would '
    'become 0; send 0 or a string.'
)
TOO_LONG = (
    'An integer in the request body has more than %d digits; send it as a string.'
    % MAX_INTEGER_DIGITS
)
DUPLICATE_KEY = 'An object in the request body has the same key twice.'
_SURROGATE = re.compile('[\ud800-\udfff]')
_NONZERO_MANTISSA = re.compile(r'^-?0*\.?0*[1-9]')


def loads(text):
    """The JSON value of ``text`` (a str), or the 400 that says why it cannot be taken."""
    if text.startswith('\ufeff'):
        # RFC 8259 §8.1: a sender must not add one; saying so beats "not valid JSON".
        raise InvalidJsonError('The request body starts with a byte order mark; send it without.')
    try:
        value = json.loads(
            text,
            parse_float=_parse_float,
            parse_int=_parse_int,
            parse_constant=_reject_constant,
            object_pairs_hook=_object,
        )
    except RecursionError:
        raise InvalidRequestError(TOO_DEEP) from None
    except ValueError:
        raise InvalidJsonError() from None
    _check_values(value)
    return value


def _parse_float(literal):
    value = float(literal)
    if not math.isfinite(value):
        raise InvalidJsonError(NOT_FINITE)
    if value == 0.0 and _NONZERO_MANTISSA.match(literal.lower().split('e')[0]):
        raise InvalidJsonError(UNDERFLOW)
    return value


def _parse_int(literal):
    # Counted before converting: int() of a very long literal is slow (and past Python's own
    # limit a ValueError that would say nothing of the limit).
    if len(literal) - literal.startswith('-') > MAX_INTEGER_DIGITS:
        raise InvalidJsonError(TOO_LONG)
    return int(literal)


def _reject_constant(name):
    raise ValueError('%s is not JSON' % name)


def _object(pairs):
    value = dict(pairs)
    if len(value) != len(pairs):
        raise InvalidJsonError(DUPLICATE_KEY)
    return value


def _check_values(body):
    """Depth and lone surrogates, over the whole value without recursion."""
    pending = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequestError(TOO_DEEP)
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())
            pending.extend((key, depth) for key in value)
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise InvalidJsonError('The request body holds a lone surrogate escape (\\ud800).')
