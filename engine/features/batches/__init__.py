"""Provider batches (issue 22): the ``ai-background`` jobs of a definition or route entry with a
BatchPolicy are answered through an OpenAI-compatible batch API at its batch price.

``items`` (a job's call parked for a batch, the line's outcome, the wake-up), ``guard`` (the
BatchGuard around each call), ``batcher`` (form, upload, create), ``poller`` (poll, results,
cancel), ``runner`` (the one step the housekeeping leader runs) and ``api`` (the client of the
provider's files and batches). docs/architecture.md, decision 18, says why a parked job is a
deferral with an item row and how each step is idempotent."""

USES = ('gateway',)  # the budgets: through their handle, when installed
