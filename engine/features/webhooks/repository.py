"""WebhookRepository (architecture decision 15): users' endpoints, and the deliveries of terminal
job events to them. A delivery is a row claimed by compare-and-set, like an outbox event
(contracts §4.3): the claim comes before the send, it lasts a lease (a worker killed mid-send
leaves a claim that expires and is claimed again), and only the claimer records the outcome."""

from ...core.models import new_id
from ...core.sql import Statement, placeholders, statement
from .models import WebhookDelivery, WebhookEndpoint

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


# The live endpoints of some jobs (fan-out): their users' endpoints, then their own webhookUrls;
# two index lookups rather than one OR join that no index serves.
_ENDPOINTS_OF_JOBS = (
    'SELECT j.id, j.job_type, e.id, e.events, e.job_types FROM ai_job j '
    'JOIN webhook_endpoint e ON e.user_id = j.user_id AND e.job_id IS NULL '
    'AND e.deleted_at IS NULL WHERE j.id IN (%s) '
    'UNION ALL '
    'SELECT j.id, j.job_type, e.id, e.events, e.job_types FROM webhook_endpoint e '
    'JOIN ai_job j ON j.id = e.job_id WHERE e.job_id IN (%s) AND e.deleted_at IS NULL'
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
    def fan_out(self, events):
        """One pending delivery of each event of ``events`` (claimed terminal outbox events) per
        endpoint that wants it: the job's user's endpoints whose events and jobTypes match, and
        the job's own ``webhookUrl``. One read finds the endpoints of every event's job (none
        at all, the usual case, costs that read only) and one INSERT writes the deliveries. Run
        in the transaction that marks the events published; a fan-out repeated after a crash
        adds nothing (UNIQUE(event_id, endpoint_id)). Returns how many deliveries."""
        job_ids = sorted({event.payload['jobId'] for event in events})
        if not job_ids:
            return 0
        marks = placeholders(len(job_ids))
        wanted = {}  # job id -> [(endpoint id, events, job types, job type)]
        decode_events = WebhookEndpoint.events.python_value
        decode_types = WebhookEndpoint.job_types.python_value
        for job_id, job_type, endpoint_id, types, job_types in self.store.execute(
            statement(_ENDPOINTS_OF_JOBS % (marks, marks)), job_ids + job_ids
        ).fetchall():
            if _wants_types(decode_events(types), decode_types(job_types), None, job_type):
                wanted.setdefault(job_id, []).append((endpoint_id, decode_events(types)))
        now = self.store.now()
        rows = [
            {
                'id': new_id(),
                'endpoint_id': endpoint_id,
                'event_id': event.id,
                'event_type': event.event_type,
                'job_id': event.payload['jobId'],
                'status': PENDING,
                'attempt_count': 0,
                'next_attempt_at': now,
                'created_at': now,
                'updated_at': now,
            }
            for event in events
            for endpoint_id, types in wanted.get(event.payload['jobId'], ())
            if not types or event.event_type in types
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

    def purge_finished(self, older_than_ms, limit=1000):
        """Delete up to ``limit`` delivered or dead deliveries last touched ``older_than_ms`` ago;
        pending and sending ones stay. Returns how many were deleted."""
        cutoff = self.store.now_plus_ms(-older_than_ms)
        ids = [
            row.id
            for row in WebhookDelivery.select(WebhookDelivery.id)
            .where(
                WebhookDelivery.status.in_((DELIVERED, DEAD))
                # next_attempt_at (at most the end of the last claim) bounds the index range
                & (WebhookDelivery.next_attempt_at < cutoff)
                & (WebhookDelivery.updated_at < cutoff)
            )
            .limit(limit)
        ]
        if not ids:
            return 0
        return WebhookDelivery.delete().where(WebhookDelivery.id.in_(ids)).execute()

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


def _wants_types(events, job_types, event_type, job_type):
    """Does an endpoint of ``events`` and ``job_types`` (None or empty: all) want this event
    (``event_type`` None: any) of a job of ``job_type``?"""
    return (not events or event_type is None or event_type in events) and (
        not job_types or job_type in job_types
    )
