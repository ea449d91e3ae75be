"""A job-type plugin for tests with real worker processes (AIJOB_DEFINITIONS=
tests.support.cached_jobs): the flashcard job with the response cache on, shared by all users."""

import dataclasses

from engine.core.registry import CachePolicy
from engine.jobtypes.flashcards import flashcard_definition

CACHED_CARDS = dataclasses.replace(
    flashcard_definition(job_type='cards_cached_global', timeout_ms=20_000, backoff_ms=20),
    cache=CachePolicy(ttl_ms=600_000, scope='global'),
)


def register(app):
    app.add_job_type(CACHED_CARDS)
