"""The tables of the response cache: their peewee models (SQLite creates them) and, in
schema.sql beside this file, the DDL MySQL/MariaDB applies (``initdb``);
tests/kernel/core/test_schema.py holds the two equal."""

import os

from peewee import CharField, IntegerField

from ...core.extension import Tables
from ...core.models import BaseModel, JSONText, Timestamp


class AiResponseCache(BaseModel):
    """The response cache (engine/features/cache/guard.py): one row per cache key. A row without
    ``output`` is a claim: job ``owner_job_id`` is calling the provider for that key, and
    identical jobs wait for its answer until ``expires_at`` (the claim's expiry). A row with
    ``output`` is an entry, live until ``expires_at``; the purger deletes expired rows."""

    cache_key = CharField(max_length=64, primary_key=True)  # SHA-256 hex of the request
    job_type = CharField(max_length=64)
    owner_job_id = CharField(max_length=36)  # the job that claimed the key or wrote the entry
    output = JSONText(null=True)  # NULL while claimed
    model = CharField(max_length=128, default='')  # the model that answered
    prompt_tokens = IntegerField(default=0)
    completion_tokens = IntegerField(default=0)
    created_at = Timestamp()
    expires_at = Timestamp()

    class Meta:
        table_name = 'ai_response_cache'
        indexes = ((('expires_at',), False),)  # the purge of expired rows


TABLES = Tables(
    (AiResponseCache,),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema.sql'),
)
