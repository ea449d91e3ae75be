"""Live text and event streams (architecture decision 15): ``GET /api/ai/jobs/{id}/stream``, a
job's history as server-sent events and, while it runs, the text its provider streams.

``pump`` (the text of running provider calls, coalesced, one pump per process), ``channel``
(where that text waits: a capped Redis stream per job, or in the process), ``text_feed`` (one
loop per web process waits for the text of every streamed job), ``stream`` (the SSE body of one
stream, built on the history), ``routes`` (the route and its OpenAPI fragment), ``settings``
(AIJOB_STREAM_*, AIJOB_MAX_STREAMS*) and ``extension`` (how it joins a runtime, and its handle).
"""

USES = ()
