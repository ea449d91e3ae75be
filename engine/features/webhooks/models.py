"""The webhooks' tables (schema.sql beside this module is their MySQL/MariaDB DDL): users'
endpoints and the deliveries of terminal job events to them (architecture decision 15)."""

from peewee import BigIntegerField, CharField, IntegerField

from ...core.models import BaseModel, JSONText, Timestamp


class WebhookEndpoint(BaseModel):
    """Where a user's terminal job events are pushed (architecture decision 15). A row with
    ``job_id`` is the ``webhookUrl`` of that one job. No secret is kept: an endpoint's signing
    secret is derived from the master key and its id (signing.py)."""

    id = CharField(max_length=36, primary_key=True)
    user_id = CharField(max_length=64)
    url = CharField(max_length=2048)
    events = JSONText(null=True)  # event types to send; null: all
    job_types = JSONText(null=True)  # job types to send; null: all
    job_id = CharField(max_length=36, null=True)
    created_at = Timestamp()
    deleted_at = Timestamp(null=True)

    class Meta:
        table_name = 'webhook_endpoint'
        indexes = (
            (('user_id', 'deleted_at'), False),  # a user's endpoints, the fan-out
            (('job_id',), False),  # a job's own webhookUrl
        )


class WebhookDelivery(BaseModel):
    """One terminal event to one endpoint: claimed by compare-and-set, retried with backoff.
    Its id is the ``webhook-id`` header of every attempt."""

    id = CharField(max_length=36, primary_key=True)
    endpoint_id = CharField(max_length=36)
    event_id = BigIntegerField()
    event_type = CharField(max_length=64)
    job_id = CharField(max_length=36)
    status = CharField(max_length=16)  # pending | sending | delivered | dead
    attempt_count = IntegerField(default=0)
    next_attempt_at = Timestamp()  # due time; while sending, the end of the claim
    locked_by = CharField(max_length=64, null=True)
    last_status_code = IntegerField(null=True)
    last_error = CharField(max_length=512, null=True)
    delivered_at = Timestamp(null=True)
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'webhook_delivery'
        indexes = (
            (('event_id', 'endpoint_id'), True),  # a fan-out repeated after a crash adds nothing
            (('status', 'next_attempt_at'), False),  # the sender's claim
            (('endpoint_id',), False),  # admin filter
            (('job_id',), False),  # admin filter
        )


MODELS = (WebhookEndpoint, WebhookDelivery)
