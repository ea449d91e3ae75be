"""The AI gateway inside the engine: what a team would otherwise run in front of its queue.

Named OpenAI-compatible providers and their models (prices, limits) from ``AIJOB_PROVIDERS``,
routes that fall back from one provider/model to the next, cooldowns and rate limits shared by
every worker process, budgets in money reserved before each call and settled with its usage row,
and an opt-in response cache. Each concept is a module of this package; the execution engine
sees them only as the gateway (``prepare_call``) and its CallGuards (execution/providers.py).

Layer: imports ``execution`` and ``core`` only; the runtime wires it (docs/architecture.md,
"The import rule")."""
