"""Provider batches (issue 22): jobs of an opted-in definition on ``ai-background`` are collected
into one OpenAI-compatible batch (a JSONL file of chat-completion requests), submitted, polled and
answered at the batch price. ``api.py`` is the client of the provider's files and batches API;
the rest of the package forms, submits, polls and settles the batches.

Layer: gateway (imports ``execution`` and ``core`` only; the runtime wires it)."""
