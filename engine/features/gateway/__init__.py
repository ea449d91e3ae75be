"""The AI gateway inside the engine: what a team would otherwise run in front of its queue.

Named OpenAI-compatible providers and their models (prices, limits) from ``AIJOB_PROVIDERS``
(providers_config.py), the OpenAI-compatible client (openai_client.py), routes that fall back
from one provider/model to the next (routes.py, context_errors.py), and cooldowns shared by
every worker process (cooldowns.py). The execution engine sees it only as the gateway
(``prepare_call``) and its CallGuards (execution/providers.py); extension.py installs it."""

USES = ()
