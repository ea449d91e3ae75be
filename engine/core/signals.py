"""What the kernel says as it works, for whoever counts it: a job created, started, retried,
deferred or finished, a provider call, a response-cache lookup, an HTTP request answered.

The kernel's parts are built with one ``Signals`` and call it where the event happens; it passes
each signal on to the receivers the extensions registered at ``Hooks.signal_receivers`` (the
metrics feature counts them as Prometheus metrics, engine/features/metrics/counters.py). This
module imports nothing and knows no metric: with no receiver installed, a signal costs one call
and a loop over an empty list (architecture.md, "Extensions").
"""


class Signals:
    """The kernel's signals. Each is passed on to every receiver: an object with a method of
    the same name and arguments, which must neither raise nor block (it runs on the hot path,
    after the event's own write committed)."""

    def __init__(self, receivers=()):
        self.receivers = receivers  # read at each signal: the list the extensions fill

    def job_created(self, job_type, queue):
        """A job was created (an idempotent replay is not)."""
        for receiver in self.receivers:
            receiver.job_created(job_type, queue)

    def job_started(self, job_type, queue, wait_s):
        """A job's first lock, ``wait_s`` after its creation (database clock)."""
        for receiver in self.receivers:
            receiver.job_started(job_type, queue, wait_s)

    def job_retried(self, job_type, error_code):
        """A provider call retried after a retryable failure."""
        for receiver in self.receivers:
            receiver.job_retried(job_type, error_code)

    def job_deferred(self, job_type, reason):
        """A job handed back until a wake time (a rate limit, a budget's wait)."""
        for receiver in self.receivers:
            receiver.job_deferred(job_type, reason)

    def job_finished(self, job_type, queue, outcome, run_s=None):
        """A terminal write that committed; ``run_s`` when the finishing worker timed it."""
        for receiver in self.receivers:
            receiver.job_finished(job_type, queue, outcome, run_s)

    def provider_call(self, provider, model, error_code, seconds, usage=None, cost=None):
        """One provider call: ``error_code`` None when it answered."""
        for receiver in self.receivers:
            receiver.provider_call(provider, model, error_code, seconds, usage, cost)

    def cache_lookup(self, job_type, hit):
        """A call guard looked for an earlier identical call's answer: found (``hit``) or not."""
        for receiver in self.receivers:
            receiver.cache_lookup(job_type, hit)

    def http_request(self, method, route, status, seconds):
        """An HTTP request answered, by its route template."""
        for receiver in self.receivers:
            receiver.http_request(method, route, status, seconds)


# What a part built on its own (a test's Reaper, say) says to nobody.
SILENT = Signals()
