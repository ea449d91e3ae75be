"""Content safety: configured and default patterns, nested content and object keys checked."""

import json

import pytest

from engine.core.errors import ContentSafetyError
from engine.execution.safety import RegexContentSafety


# ---------------------------------------------------------------- content safety
def test_a_configured_pattern_blocks_nested_content_case_insensitively():
    policy = RegexContentSafety.from_list(json.loads(r'["\\bforbidden\\s+topic\\b"]'))
    with pytest.raises(ContentSafetyError) as caught:
        policy.check({'cards': [{'question': 'Q', 'answer': 'a FORBIDDEN  Topic here'}]}, 'output')
    assert caught.value.code == 'CONTENT_SAFETY_BLOCKED' and not caught.value.retryable
    assert 'FORBIDDEN' not in str(caught.value)  # the matched text is never echoed
    assert 'output' in caught.value.public_message


def test_clean_content_passes():
    policy = RegexContentSafety.from_list(json.loads('["forbidden"]'))
    assert policy.check({'text': 'a perfectly fine text', 'n': 3}, 'input') is None


def test_the_default_policy_blocks_private_keys():
    policy = RegexContentSafety.from_list(None)
    with pytest.raises(ContentSafetyError):
        policy.check({'text': 'x -----BEGIN RSA PRIVATE KEY----- y'}, 'input')
    policy.check({'text': 'public keys are fine'}, 'input')


def test_keys_of_objects_are_checked_too():
    with pytest.raises(ContentSafetyError):
        RegexContentSafety.from_list(json.loads('["secret"]')).check({'my secret': 1}, 'input')
