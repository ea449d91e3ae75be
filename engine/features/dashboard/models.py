"""The dashboard's table as a peewee model; schema.sql beside it is the same table's MySQL DDL."""

from peewee import CharField

from ...core.models import BaseModel, Timestamp


class DashboardSession(BaseModel):
    """A signed-in dashboard session, stored as the SHA-256 of its id only (the id lives in the
    operator's HttpOnly cookie). It remembers the admin token it was opened with, so revoking
    that token ends the session too."""

    session_hash = CharField(max_length=64, primary_key=True)
    token_hash = CharField(max_length=64)
    user_id = CharField(max_length=64)
    created_at = Timestamp()
    expires_at = Timestamp()

    class Meta:
        table_name = 'dashboard_session'
        indexes = ((('expires_at',), False),)  # the purge of expired sessions


MODELS = (DashboardSession,)
