"""How OpenAI-compatible servers say that a request does not fit the model's context: the one
table the provider client reads to classify a 4xx as ``PROVIDER_BAD_REQUEST_CONTEXT_LENGTH``
(contracts §5.2), so that the gateway can move the job to an entry with a larger context."""

from collections import namedtuple

# ``field`` is the part of the error body (``{"error": {"code", "type", "message"}}``) the sign
# is read in: a ``code`` or ``type`` matches when it equals ``text``, a ``message`` when it
# contains it; case is ignored. Codes and types come first: they are the servers' stable words,
# the phrasings are what is left when a server (or a proxy in front of it) sends none.
ContextLengthSign = namedtuple('ContextLengthSign', 'provider field text')

CONTEXT_LENGTH_SIGNS = (
    ContextLengthSign('OpenAI', 'code', 'context_length_exceeded'),
    ContextLengthSign('llama.cpp', 'type', 'exceed_context_size_error'),
    # LiteLLM's proxy: "litellm.ContextWindowExceededError: ..." (or wrapped in a
    # "litellm.BadRequestError: ..."), with type null and code "400".
    ContextLengthSign('LiteLLM', 'message', 'contextwindowexceedederror'),
    # "the request exceeds the available context size, try increasing it", and
    # "request (N tokens) exceeds the available context size (M tokens), ...".
    ContextLengthSign('llama.cpp', 'message', 'exceeds the available context size'),
    # "The decoder prompt (length N) is longer than the maximum model length of M."
    ContextLengthSign('vLLM', 'message', 'longer than the maximum model length'),
    # "This model's maximum context length is N tokens. However, you requested M tokens ..."
    # (DeepSeek sends it with code "invalid_request_error", vLLM with code 400).
    ContextLengthSign('OpenAI, DeepSeek, vLLM', 'message', 'maximum context length'),
)


def context_length_sign(code, error_type, message):
    """The first sign in CONTEXT_LENGTH_SIGNS an error body shows, or None."""
    parts = {
        'code': str(code or '').lower(),
        'type': str(error_type or '').lower(),
        'message': str(message or '').lower(),
    }
    for sign in CONTEXT_LENGTH_SIGNS:
        seen = parts[sign.field]
        if seen == sign.text or (sign.field == 'message' and sign.text in seen):
            return sign
    return None
