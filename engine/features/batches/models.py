"""The tables of provider batches: their peewee models (SQLite creates them) and, in
schema.sql beside this file, the DDL MySQL/MariaDB applies (``initdb``);
tests/kernel/core/test_schema.py holds the two equal."""

import os

from peewee import BigAutoField, CharField, DecimalField, IntegerField

from ...core.extension import Tables
from ...core.models import BaseModel, JSONText, Timestamp


class AiProviderBatch(BaseModel):
    """One batch sent to a provider's batch API (engine/features/batches/): the ids that make
    every step idempotent through a restart (the uploaded file, the provider's batch), its
    state as we know it and when to look at it next.

    ``state``: building (its items are chosen, nothing uploaded) -> uploaded (input file id
    stored) -> submitted (provider batch id stored; ``provider_status`` is what the provider
    last said) -> ended (every item has its outcome). ``cancelling``: every job of it was
    cancelled, the provider is told to cancel."""

    id = CharField(max_length=36, primary_key=True)
    provider = CharField(max_length=64)  # the route entry the batch goes to
    model = CharField(max_length=128)
    state = CharField(max_length=16)
    provider_status = CharField(max_length=32, default='')  # validating | in_progress | …
    input_file_id = CharField(max_length=128, null=True)
    provider_batch_id = CharField(max_length=128, null=True)
    output_file_id = CharField(max_length=128, null=True)
    error_file_id = CharField(max_length=128, null=True)
    job_count = IntegerField(default=0)
    succeeded_count = IntegerField(default=0)  # lines answered
    failed_count = IntegerField(default=0)  # lines that failed, expired or were cancelled
    cost = DecimalField(max_digits=14, decimal_places=6, default=0)  # at the batch price
    poll_count = IntegerField(default=0)
    next_poll_at = Timestamp(null=True)
    created_at = Timestamp()
    submitted_at = Timestamp(null=True)
    ended_at = Timestamp(null=True)
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_provider_batch'
        indexes = ((('state', 'next_poll_at'), False), (('created_at',), False))


class AiProviderBatchItem(BaseModel):
    """One job's attempt waiting for, or sent in, a provider batch: the request exactly as the
    online path renders it, and the line's outcome. ``custom_id`` = '<job id>:<attempt>'.

    ``state``: waiting (no batch yet) -> batched (in ``batch_id``) -> answered (``response``
    holds the line's body) | failed (``error_code``, ``response`` the line's error) | expired
    (goes online) | cancelled; consumed once the job's attempt has used the answer."""

    id = BigAutoField()
    job_id = CharField(max_length=36)
    attempt_no = IntegerField()
    custom_id = CharField(max_length=64)
    group_key = CharField(max_length=200)  # 'provider/model': jobs batched together
    batch_id = CharField(max_length=36, null=True)
    state = CharField(max_length=16)
    request = JSONText()  # the chat completion body the online path would send
    response = JSONText(null=True)  # the line's response body (answered)
    error_code = CharField(max_length=64, null=True)
    max_wait_ms = IntegerField()  # the job's BatchPolicy, when it was queued for a batch
    max_jobs = IntegerField()
    # The job's lock (its attempt_no) that was last deferred for this item: a job whose
    # attempt_no still equals it waits for this item alone, and its outcome wakes it.
    parked_attempt = IntegerField()
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_provider_batch_item'
        indexes = (
            (('custom_id',), True),
            (('job_id',), False),
            (('batch_id',), False),
            (('state', 'group_key', 'created_at'), False),
        )


TABLES = Tables(
    (
        AiProviderBatch,
        AiProviderBatchItem,
    ),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema.sql'),
)
