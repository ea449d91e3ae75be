"""The webhook sender of a worker process (architecture decision 15): it claims due deliveries
(written by the fan-out, repository.py) by compare-and-set and POSTs them, signed, from threads
of its own (at most AIJOB_WEBHOOK_CONCURRENCY), so a slow or dead receiver never holds up a job.
A failed attempt is retried with exponential backoff and jitter, then the delivery is dead.
At-least-once: a sender killed mid-send leaves a claim whose lease expires, and the same
``webhook-id`` goes out again.
"""

import http.client
import json
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor

from ...core.errors import WebhookUrlRefusedError
from ...core.logs import log_event
from ...core.status_view import find_for_status, job_status
from . import http_post
from .signing import signed_headers
from .urls import check_url

BACKOFF_FACTOR = 5  # each retry waits 5 times longer: 5 s, 25 s, 2 min, 10 min, 52 min, 4 h, 22 h
JITTER = 0.2  # ± this share of each delay, so the retries of many deliveries spread out


def retry_delay_ms(attempts, base_ms, rng=random):
    """The wait after the ``attempts``-th failed attempt (1, 2, …), jitter included."""
    delay = base_ms * BACKOFF_FACTOR ** (attempts - 1)
    return int(delay * rng.uniform(1 - JITTER, 1 + JITTER))


class WebhookSender:
    def __init__(self, webhooks, signer, policy, instance_id, connection, settings):
        self.webhooks = webhooks
        self.signer = signer
        self.policy = policy
        self.instance_id = instance_id
        self.connection = connection
        self.timeout_s = settings.webhook_timeout_ms / 1000.0
        self.max_attempts = settings.webhook_max_attempts
        self.retry_base_ms = settings.webhook_retry_base_ms
        self.concurrency = settings.webhook_concurrency
        # A claim outlives the longest send (connect, then each read, within the timeout).
        self.lease_ms = 2 * settings.webhook_timeout_ms + 1000
        self.wake = threading.Event()
        self._pool = None
        self._in_flight = 0
        self._lock = threading.Lock()
        self._claims = 0

    def cycle(self):
        """Claim as many due deliveries as there are free sending threads and start them.
        Returns how many were started."""
        with self._lock:
            free = self.concurrency - self._in_flight
        if free <= 0:
            return 0
        self._claims += 1
        claimer = '%s#s%d' % (self.instance_id, self._claims)
        deliveries = self.webhooks.claim_due(claimer, free, self.lease_ms)
        if deliveries and self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix='webhook')
        for delivery in deliveries:
            with self._lock:
                self._in_flight += 1
            self._pool.submit(self.send, delivery, claimer)
        return len(deliveries)

    def send(self, delivery, claimer):
        """One attempt, then its outcome recorded (only while ``claimer``'s claim holds)."""
        try:
            status_code, error = self.attempt(delivery)
            with self.connection():
                self._record(delivery, claimer, status_code, error)
        except Exception:  # a store outage: the claim expires and the delivery is retried
            log_event('webhook.send_failed', logging.ERROR, exc_info=True, delivery_id=delivery.id)
        finally:
            with self._lock:
                self._in_flight -= 1
            self.wake.set()

    def attempt(self, delivery):
        """POST the job's status to the endpoint: (HTTP status or None, error or None). Holds
        a database connection only to read the job, never while the receiver answers."""
        endpoint = delivery.endpoint
        if endpoint.deleted_at is not None:
            return None, 'ENDPOINT_DELETED'
        with self.connection():
            job, refs = find_for_status(delivery.job_id)
        if job is None:
            return None, 'JOB_NOT_FOUND'
        body = json.dumps(job_status(job, refs), separators=(',', ':')).encode('utf-8')
        try:
            target = check_url(endpoint.url, self.policy)  # again now: DNS may have changed
        except WebhookUrlRefusedError as exc:
            return None, '%s: %s' % (exc.code, exc.public_message)
        headers = signed_headers(self.signer.secret_for(endpoint), delivery.id, body)
        try:
            return http_post.post(target, body, headers, self.timeout_s), None
        except (OSError, http.client.HTTPException) as exc:
            return None, 'SEND_FAILED: %s' % exc.__class__.__name__

    def _record(self, delivery, claimer, status_code, error):
        fields = dict(
            delivery_id=delivery.id,
            endpoint_id=delivery.endpoint_id,
            job_id=delivery.job_id,
            attempt=delivery.attempt_count + 1,
            status_code=status_code,
        )
        if status_code is not None and 200 <= status_code < 300:
            self.webhooks.record_delivered(delivery, claimer, status_code)
            log_event('webhook.delivered', **fields)
            return
        attempts = delivery.attempt_count + 1
        error = error or 'HTTP %d' % status_code
        final = attempts >= self.max_attempts or error == 'ENDPOINT_DELETED'
        retry_in_ms = None if final else retry_delay_ms(attempts, self.retry_base_ms)
        self.webhooks.record_failed(delivery, claimer, status_code, error, retry_in_ms)
        fields.update(error=error.split(':')[0], retry_in_ms=retry_in_ms)
        if final:
            log_event('webhook.dead', logging.WARNING, **fields)
        else:
            log_event('webhook.retry', logging.WARNING, **fields)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def run_webhooks(sender, poll_s, stop, connection, lead=None):
    """The webhook thread of a worker process (the hook point worker_loops): send what is due,
    every ``poll_s`` (sooner when a send finishes and frees a thread). Every process sends:
    deliveries are claimed by CAS. ``lead`` is not needed: the fan-out is the leader's (the
    kernel's terminal events, engine/dispatch/terminal.py)."""
    while not stop.is_set():
        try:
            with connection():
                sender.cycle()
        except Exception:  # a store outage: log, wait, go on
            log_event('webhook.cycle_failed', logging.ERROR, exc_info=True)
        sender.wake.wait(poll_s)
        sender.wake.clear()
    sender.close()
