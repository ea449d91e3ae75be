"""The counters and histograms (README "Metrics"): the kernel's signals (engine/core/signals.py)
counted as Prometheus families. ``Counting`` is the receiver the metrics extension registers at
``Hooks.signal_receivers``; the gauges read at scrape time are scrape.py's.

Every family is made once per process, on first use, outside prometheus_client's global
registry, so a scrape chooses what to collect: these families themselves in a single process,
or the files of every process under ``PROMETHEUS_MULTIPROC_DIR`` when gunicorn runs several
workers (processes.py, before the server forks).

The hot path pays one dict lookup and one increment per event: a family's children are cached
by their label values (``labels()`` would validate and lock each time).
"""

import threading

from prometheus_client import Counter, Histogram

# Seconds: jobs and provider calls run from milliseconds to minutes.
JOB_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# Requests, long polls (waitMs up to 30 s) included.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Family:
    """One metric family and its children, cached by label values."""

    def __init__(self, kind, name, help_text, labels, **options):
        self.kind, self.name, self.help_text = kind, name, help_text
        self.labelnames, self.options = tuple(labels), options
        self.metric = None
        self._children = {}
        self._lock = threading.Lock()

    def child(self, *label_values):
        found = self._children.get(label_values)
        if found is not None:
            return found
        with self._lock:
            if self.metric is None:
                self.metric = self.kind(
                    self.name, self.help_text, self.labelnames, registry=None, **self.options
                )
            found = self._children[label_values] = self.metric.labels(*label_values)
        return found

    def reset(self):
        """Forget the children (their values were made for another process or another
        directory; a fork or a new multiprocess directory starts from the files)."""
        with self._lock:
            self.metric = None
            self._children = {}


JOBS_CREATED = Family(
    Counter, 'aijob_jobs_created', 'Jobs created (replays excluded).', ('job_type', 'queue')
)
JOBS_FINISHED = Family(
    Counter,
    'aijob_jobs_finished',
    'Jobs that reached a terminal state, by outcome (succeeded, failed, cancelled).',
    ('job_type', 'queue', 'outcome'),
)
JOB_DURATION = Family(
    Histogram,
    'aijob_job_duration_seconds',
    'Run time of the attempt that finished a job: from its lock to its terminal write.',
    ('job_type', 'queue', 'outcome'),
    buckets=JOB_BUCKETS,
)
QUEUE_WAIT = Family(
    Histogram,
    'aijob_job_queue_wait_seconds',
    "From a job's creation to its first lock (database clock).",
    ('job_type', 'queue'),
    buckets=JOB_BUCKETS,
)
RETRIES = Family(
    Counter,
    'aijob_job_retries',
    'Provider calls retried after a retryable failure, by error code.',
    ('job_type', 'error_code'),
)
# Issue 21: jobs handed back until a wake time (a rate limit or budget said wait).
DEFERRALS = Family(
    Counter,
    'aijob_job_deferrals',
    'Jobs handed back to wait without a worker (no retry spent), by the rule that said wait.',
    ('job_type', 'reason'),
)
PROVIDER_CALLS = Family(
    Counter,
    'aijob_provider_calls',
    'Provider calls, by result (ok or the error code).',
    ('provider', 'model', 'result'),
)
PROVIDER_LATENCY = Family(
    Histogram,
    'aijob_provider_call_duration_seconds',
    'Provider call latency.',
    ('provider', 'model'),
    buckets=JOB_BUCKETS,
)
PROVIDER_TOKENS = Family(
    Counter,
    'aijob_provider_tokens',
    'Tokens the provider reported, by kind (prompt, completion).',
    ('provider', 'model', 'kind'),
)
PROVIDER_COST = Family(
    Counter,
    'aijob_provider_cost',
    "Cost of provider calls in the currency of the provider config's prices.",
    ('provider', 'model'),
)
HTTP_REQUESTS = Family(
    Counter,
    'aijob_http_requests',
    'HTTP requests answered, by route template and status.',
    ('method', 'route', 'status'),
)
HTTP_LATENCY = Family(
    Histogram,
    'aijob_http_request_duration_seconds',
    'HTTP request latency by route template (long polls included).',
    ('method', 'route'),
    buckets=HTTP_BUCKETS,
)
# The response cache (engine/features/cache/guard.py): lookups of job types that opt in.
CACHE_HITS = Family(
    Counter,
    'aijob_cache_hits',
    'Provider calls answered by the response cache (after waiting for an identical call too).',
    ('job_type',),
)
CACHE_MISSES = Family(
    Counter,
    'aijob_cache_misses',
    'Response cache lookups that found no live entry, so the provider was called.',
    ('job_type',),
)

FAMILIES = (
    JOBS_CREATED,
    JOBS_FINISHED,
    JOB_DURATION,
    QUEUE_WAIT,
    RETRIES,
    DEFERRALS,
    PROVIDER_CALLS,
    PROVIDER_LATENCY,
    PROVIDER_TOKENS,
    PROVIDER_COST,
    HTTP_REQUESTS,
    HTTP_LATENCY,
    CACHE_HITS,
    CACHE_MISSES,
)


class Counting:
    """The receiver of the kernel's signals (core.signals.Signals): each counted in its
    families. Stateless: the families are the process's."""

    def job_created(self, job_type, queue):
        JOBS_CREATED.child(job_type, queue).inc()

    def job_finished(self, job_type, queue, outcome, run_s=None):
        JOBS_FINISHED.child(job_type, queue, outcome).inc()
        if run_s is not None:
            JOB_DURATION.child(job_type, queue, outcome).observe(run_s)

    def job_started(self, job_type, queue, wait_s):
        QUEUE_WAIT.child(job_type, queue).observe(max(0.0, wait_s))

    def job_retried(self, job_type, error_code):
        RETRIES.child(job_type, error_code).inc()

    def job_deferred(self, job_type, reason):
        DEFERRALS.child(job_type, reason).inc()

    def provider_call(self, provider, model, error_code, seconds, usage=None, cost=None):
        provider, model = provider or '', model or ''
        PROVIDER_CALLS.child(provider, model, error_code or 'ok').inc()
        PROVIDER_LATENCY.child(provider, model).observe(seconds)
        if usage is not None:
            if usage.prompt_tokens:
                PROVIDER_TOKENS.child(provider, model, 'prompt').inc(usage.prompt_tokens)
            if usage.completion_tokens:
                PROVIDER_TOKENS.child(provider, model, 'completion').inc(usage.completion_tokens)
        if cost:
            PROVIDER_COST.child(provider, model).inc(float(cost))

    def cache_lookup(self, job_type, hit):
        (CACHE_HITS if hit else CACHE_MISSES).child(job_type).inc()

    def http_request(self, method, route, status, seconds):
        HTTP_REQUESTS.child(method, route, str(status)).inc()
        HTTP_LATENCY.child(method, route).observe(seconds)


def reset_all():
    """Every family forgets its children: the values made so far were for another process or
    another directory (processes.py)."""
    for family in FAMILIES:
        family.reset()
