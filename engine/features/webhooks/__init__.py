"""Webhooks (architecture decision 15): users' endpoints for the terminal events of their jobs,
and a job's own ``webhookUrl``; each terminal event becomes one signed delivery per endpoint
that wants it, sent by every worker process and retried with backoff.

``models`` and ``schema.sql`` (the tables), ``repository`` (endpoints, the fan-out, deliveries
claimed by compare-and-set, the purge), ``urls`` (where a webhook may point), ``signing``
(Standard Webhooks signatures, secrets derived from the master key), ``http_post`` (one POST to
a checked address), ``sender`` (the worker loop that sends), ``job_url`` (the create body's
``webhookUrl``), ``routes`` (the API and its OpenAPI fragment), ``settings`` (AIJOB_WEBHOOK_*)
and ``extension`` (how it all joins a runtime)."""

USES = ()
