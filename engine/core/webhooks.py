"""WebhookRepository (architecture decision 15): users' endpoints, and the deliveries of terminal
job events to them. A delivery is a row claimed by compare-and-set, like an outbox event
(contracts §4.3): the claim comes before the send, it lasts a lease (a worker killed mid-send
leaves a claim that expires and is claimed again), and only the claimer records the outcome."""

from .models import AiJob, WebhookDelivery, WebhookEndpoint, new_id
from .sql import Statement

PENDING, SENDING, DELIVERED, DEAD = 'pending', 'sending', 'delivered', 'dead'
STATUSES = (PENDING, SENDING, DELIVERED, DEAD)

_CLAIM_SET = (
    "UPDATE webhook_delivery SET status = 'sending', locked_by = %s, "
    'next_attempt_at = {now_plus}, updated_at = {now} WHERE '
)
# A sending row whose lease ran out is due again: its sender died (or hung) mid-send.
_DUE = (
    "status IN ('pending', 'sending') AND next_attempt_at <= {now} "
    'ORDER BY next_attempt_at LIMIT %s'
)
CLAIM_DUE = Statement(
    _CLAIM_SET + _DUE,
    _CLAIM_SET + 'id IN (SELECT id FROM webhook_delivery WHERE ' + _DUE + ')',
)
ANY_DUE = Statement(
    "SELECT id FROM webhook_delivery WHERE status IN ('pending', 'sending') "
    'AND next_attempt_at <= {now} LIMIT 1'
)


class WebhookRepository:
    """Runs on the caller's connection (an API request, a delivery loop's unit of work)."""

    def __init__(self, store):
        self.store = store

    # ------------------------------------------------------------ endpoints
    def create_endpoint(self, user_id, url, events=None, job_types=None, job_id=None):
        """A new endpoint; ``job_id`` makes it the ``webhookUrl`` of that one job (written in
        the job's creating transaction). The URL was checked by the caller."""
        endpoint = WebhookEndpoint(
            id=new_id(),
            user_id=user_id,
            url=url,
            events=list(events) if events else None,
            job_types=list(job_types) if job_types else None,
            job_id=job_id,
            created_at=self.store.now(),
        )
        endpoint.save(force_insert=True)
        return WebhookEndpoint.get_by_id(endpoint.id)

    def list_endpoints(self, user_id):
        return list(
            WebhookEndpoint.select()
            .where(
                (WebhookEndpoint.user_id == user_id)
                & WebhookEndpoint.deleted_at.is_null()
                & WebhookEndpoint.job_id.is_null()
            )
            .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        )

    def delete_endpoint(self, user_id, endpoint_id):
        """Stop sending to one of the user's endpoints (kept, deleted, for the delivery
        history). False if the user has no such endpoint."""
        return bool(
            WebhookEndpoint.update({WebhookEndpoint.deleted_at: self.store.now()})
            .where(
                (WebhookEndpoint.id == endpoint_id)
                & (WebhookEndpoint.user_id == user_id)
                & WebhookEndpoint.deleted_at.is_null()
                & WebhookEndpoint.job_id.is_null()
            )
            .execute()
        )

    # ------------------------------------------------------------ fan-out
    def fan_out(self, event):
        """One pending delivery of ``event`` (a claimed terminal outbox event) per endpoint that
        wants it: the job's user's endpoints whose events and jobTypes match, and the job's own
        ``webhookUrl``. Run in the transaction that marks the event published; a fan-out repeated
        after a crash adds nothing (UNIQUE(event_id, endpoint_id)). Returns how many."""
        job_id = event.payload['jobId']
        job = AiJob.select(AiJob.user_id, AiJob.job_type).where(AiJob.id == job_id).first()
        if job is None:
            return 0
        endpoints = WebhookEndpoint.select().where(
            WebhookEndpoint.deleted_at.is_null()
            & (
                ((WebhookEndpoint.user_id == job.user_id) & WebhookEndpoint.job_id.is_null())
                | (WebhookEndpoint.job_id == job_id)
            )
        )
        rows = [
            {
                'id': new_id(),
                'endpoint_id': endpoint.id,
                'event_id': event.id,
                'event_type': event.event_type,
                'job_id': job_id,
                'status': PENDING,
                'attempt_count': 0,
                'next_attempt_at': self.store.now(),
                'created_at': self.store.now(),
                'updated_at': self.store.now(),
            }
            for endpoint in endpoints
            if _wants(endpoint, event.event_type, job.job_type)
        ]
        if rows:
            WebhookDelivery.insert_many(rows).on_conflict_ignore().execute()
        return len(rows)

    # ------------------------------------------------------------ sending
    def claim_due(self, claimer, limit, lease_ms):
        """CAS up to ``limit`` due deliveries → sending for ``claimer`` (unique to this claim)
        for ``lease_ms``; returns them with their endpoints. A delivery another sender claimed
        first is not matched, so no two senders send one delivery at the same time."""
        if self.store.execute(ANY_DUE).fetchone() is None:
            return []
        params = (claimer, self.store.ms_param(lease_ms), limit)
        if self.store.execute(CLAIM_DUE, params).rowcount == 0:
            return []
        query = (
            WebhookDelivery.select(WebhookDelivery, WebhookEndpoint)
            .join(
                WebhookEndpoint,
                on=(WebhookEndpoint.id == WebhookDelivery.endpoint_id),
                attr='endpoint',
            )
            .where((WebhookDelivery.status == SENDING) & (WebhookDelivery.locked_by == claimer))
        )
        return list(query)

    def record_delivered(self, delivery, claimer, status_code):
        return self._record(
            delivery,
            claimer,
            {
                WebhookDelivery.status: DELIVERED,
                WebhookDelivery.attempt_count: delivery.attempt_count + 1,
                WebhookDelivery.last_status_code: status_code,
                WebhookDelivery.last_error: None,
                WebhookDelivery.delivered_at: self.store.now(),
            },
        )

    def record_failed(self, delivery, claimer, status_code, error, retry_in_ms):
        """A failed attempt: due again in ``retry_in_ms``, or dead when that is None."""
        values = {
            WebhookDelivery.status: PENDING if retry_in_ms is not None else DEAD,
            WebhookDelivery.attempt_count: delivery.attempt_count + 1,
            WebhookDelivery.last_status_code: status_code,
            WebhookDelivery.last_error: error[:512],
        }
        if retry_in_ms is not None:
            values[WebhookDelivery.next_attempt_at] = self.store.now_plus_ms(retry_in_ms)
        return self._record(delivery, claimer, values)

    def _record(self, delivery, claimer, values):
        """Only the claimer records, and only while its claim holds (a sender that outlived
        its lease lost the delivery to another, which records instead)."""
        values = {
            **values,
            WebhookDelivery.locked_by: None,
            WebhookDelivery.updated_at: self.store.now(),
        }
        return bool(
            WebhookDelivery.update(values)
            .where(
                (WebhookDelivery.id == delivery.id)
                & (WebhookDelivery.status == SENDING)
                & (WebhookDelivery.locked_by == claimer)
            )
            .execute()
        )

    # ------------------------------------------------------------ operators
    def get_delivery(self, delivery_id):
        return (
            WebhookDelivery.select(WebhookDelivery, WebhookEndpoint)
            .join(
                WebhookEndpoint,
                on=(WebhookEndpoint.id == WebhookDelivery.endpoint_id),
                attr='endpoint',
            )
            .where(WebhookDelivery.id == delivery_id)
            .first()
        )

    def list_deliveries(self, status=None, endpoint_id=None, job_id=None, limit=50, before=None):
        """Newest first (ids are time-ordered); ``before`` is the last id of the previous page."""
        query = WebhookDelivery.select(WebhookDelivery, WebhookEndpoint).join(
            WebhookEndpoint, on=(WebhookEndpoint.id == WebhookDelivery.endpoint_id), attr='endpoint'
        )
        for column, value in (
            (WebhookDelivery.status, status),
            (WebhookDelivery.endpoint_id, endpoint_id),
            (WebhookDelivery.job_id, job_id),
        ):
            if value is not None:
                query = query.where(column == value)
        if before is not None:
            query = query.where(WebhookDelivery.id < before)
        return list(query.order_by(WebhookDelivery.id.desc()).limit(limit))

    def redeliver(self, delivery_id):
        """Send a delivery again now, with a fresh attempt budget and the same id. False if it
        is being sent right now (its outcome is not known yet)."""
        return bool(
            WebhookDelivery.update(
                {
                    WebhookDelivery.status: PENDING,
                    WebhookDelivery.attempt_count: 0,
                    WebhookDelivery.next_attempt_at: self.store.now(),
                    WebhookDelivery.locked_by: None,
                    WebhookDelivery.updated_at: self.store.now(),
                }
            )
            .where((WebhookDelivery.id == delivery_id) & (WebhookDelivery.status != SENDING))
            .execute()
        )


def _wants(endpoint, event_type, job_type):
    return (not endpoint.events or event_type in endpoint.events) and (
        not endpoint.job_types or job_type in endpoint.job_types
    )
