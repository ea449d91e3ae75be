"""ContentSafetyService: a configurable keyword/regex policy run on a job's input and output when
its definition sets ``security.contentSafetyCheck``. A hit fails the job CONTENT_SAFETY_BLOCKED,
never retried. Error messages name the stage and pattern number, never the matched text."""

import re

from ..core.errors import ContentSafetyError

# Never send a private key to a model, never store one produced by a model.
DEFAULT_PATTERNS = (r'-----BEGIN [A-Z ]*PRIVATE KEY-----',)


def parse_patterns(raw):
    """Compiled patterns from ``AIJOB_CONTENT_SAFETY_PATTERNS`` (regular expressions, matched
    case-insensitively); None → the defaults."""
    if raw is None:
        return [re.compile(p, re.IGNORECASE) for p in DEFAULT_PATTERNS]
    compiled = []
    for number, pattern in enumerate(raw, 1):
        try:
            compiled.append(re.compile(pattern, re.IGNORECASE))
        except re.error as exc:
            raise ValueError(
                'pattern #%d is not a regular expression: %s' % (number, exc)
            ) from None
    return compiled


class RegexContentSafety:
    """The ``security.contentSafetyCheck`` hook: case-insensitive patterns, checked on a job's
    input and output (``stage`` is 'input' or 'output')."""

    def __init__(self, patterns):
        self._patterns = list(patterns)

    @classmethod
    def from_list(cls, raw):
        return cls(parse_patterns(raw))

    def check(self, value, stage):
        """Raise ContentSafetyError if any string in ``value`` (keys included) matches."""
        for text in _strings(value):
            for number, pattern in enumerate(self._patterns, 1):
                if pattern.search(text):
                    raise ContentSafetyError(
                        'content safety: %s matched pattern #%d' % (stage, number),
                        public_message='The %s was blocked by the content safety policy.' % stage,
                    )


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
