"""The response cache (issue 21, item 6), opt-in per job definition with ``cache=CachePolicy(ttl_ms,
scope)``: an identical request answered within ``ttl_ms`` is answered again without a provider.

The key is the SHA-256 of the canonical JSON of what decides the answer: provider, model, prompt
template and version, the rendered messages (the job's input for a provider without templates),
the sampling parameters sent, the output schema version, and the user in scope ``user`` (one
user's output never reaches another unless the definition says ``global``).

Entries live in ``ai_response_cache`` with their expiry on the database clock (decision 2), so
they survive restarts; the purger deletes expired rows. An entry is written by ``settle`` in the
PROJECT transaction of the job whose provider call produced it, so it exists only for an output
that was validated and committed. A hit goes through the same output validation and projection
as a provider's answer, with a usage row marked ``cached`` at cost 0 and a ``cache_hit`` event.

Identical jobs at once call the provider once (single-flight): the first inserts a *claim* (a row
without output, owned by its job, expiring with the job's timeout); the others wait for the
entry, polling the row, for at most half their own timeout, then call the provider themselves
rather than time out. A claim whose owner failed is released at once; one whose worker died
expires. A job identical to an earlier one of its own worker thread's batch does not wait (the
batch's successes commit together at its end): it calls the provider too.
"""

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional

from ...core.errors import JobCancelledError
from ...core.history import CACHE_HIT, NewEvent, insert_events
from ...core.logs import log_event
from ...core.models import AiJob, canonical_hash
from ...core.signals import SILENT
from ...core.store import IntegrityError, db_now
from ...execution.providers import CallGuard, ProviderResult, Usage
from .models import AiResponseCache

NOTE = 'cache'  # the guard's key in ProviderCall.notes
# A claim outlives its owner's provider call (bounded by the definition's timeout) by this much,
# to cover the PROJECT transaction that writes the entry.
CLAIM_MARGIN_MS = 5_000
POLL_S = 0.05  # how often a job waiting for an identical call looks for its entry
_WAIT = object()  # another job's claim on the key is live
# The parameters the OpenAI-compatible provider sends besides the model and the messages.
RESPONSE_FORMAT = {'type': 'json_object'}
# Failures of a cached output itself (it no longer passes the job's checks): its entry goes.
OUTPUT_REJECTED = ('VALIDATION_', 'CONTENT_SAFETY_BLOCKED', 'INTERNAL_PROJECTION_FAILED')


@dataclass
class _Note:
    """What the guard decided for one call."""

    key: str
    state: str  # 'hit' | 'claimed' (this job calls the provider for the key) | 'unclaimed'
    source_job_id: Optional[str] = None  # a hit: the job whose answer it reuses
    saved: Optional[Usage] = None  # a hit: the tokens that answer took (none are used now)


def cache_key(call):
    """The hex SHA-256 identifying ``call``'s request (see the module docstring)."""
    request, definition, job = call.request, call.definition, call.job
    prompts = getattr(call.provider, 'prompts', None)
    document = {
        'provider': call.provider_key,
        'model': call.model,
        'jobType': job.job_type,
        'outputSchemaVersion': job.output_schema_version or definition.output.schema_version,
    }
    if prompts is not None:
        template = prompts.get(request.job_type, request.prompt_version)
        document['template'] = [template.job_type, template.version]
        document['messages'] = prompts.render(request)
        document['sampling'] = {'response_format': RESPONSE_FORMAT, 'max_tokens': call.max_tokens}
    else:  # a provider without templates (the synthetic one) answers from the input itself
        document['input'] = request.input
        document['sampling'] = {'max_tokens': call.max_tokens}
    if definition.cache.scope == 'user':
        document['userId'] = job.user_id
    return canonical_hash(document)


class CacheGuard(CallGuard):
    """The response cache around each provider call of a job type that opts in; the first
    guard, so a hit reserves no rate-limit slot and no budget."""

    name = NOTE

    def __init__(self, store, poll_s=POLL_S, claim_margin_ms=CLAIM_MARGIN_MS, signals=SILENT):
        self.store = store
        self.signals = signals  # each lookup, hit or miss (core/signals.py)
        self.poll_s = poll_s
        self.claim_margin_ms = claim_margin_ms
        # A pooled database gets a connection per unit of work; SQLite keeps the thread's own.
        self._unit = store.connection if store.dialect == 'mysql' else contextlib.nullcontext
        # Keys whose provider answered here and whose entry waits for its job's commit, with
        # the thread that will commit it: a worker thread runs a batch of jobs and commits
        # their successes together, so a job of that batch must not wait for that entry.
        self._answered = {}
        self._answered_lock = threading.Lock()

    # ---------------------------------------------------------------- before the call
    def before(self, call):
        if call.definition.cache is None or call.request.overrides.get('noCache'):
            return None
        key = cache_key(call)
        timeout_ms = call.definition.execution.timeout_ms
        give_up_at = time.monotonic() + timeout_ms / 2000.0
        while True:
            with self._unit():  # one unit per look: no connection is held while waiting
                answer = self._look(call, key, timeout_ms)
                if answer is not _WAIT:
                    return answer
                if time.monotonic() >= give_up_at:  # its call is slow: do not time out waiting
                    return self._miss(call, key, 'unclaimed')
                self._check_cancel(call)
            time.sleep(self.poll_s)

    def _look(self, call, key, timeout_ms):
        """The hit, None once this job holds the claim (a miss), or _WAIT while another job's
        claim on the key is live."""
        while True:
            found = self._read(key)
            if found is not None and found.live and found.output is not None:
                return self._hit(call, key, found)
            if found is not None and found.live and found.owner_job_id != call.job.id:
                if self._answered.get(key) == threading.get_ident():
                    return self._miss(call, key, 'unclaimed')  # the entry waits for this thread
                return _WAIT
            if self._claim(call, key, found, timeout_ms):
                return self._miss(call, key, 'claimed')
            # another job claimed it between the read and the claim: look again

    def _read(self, key):
        live = (AiResponseCache.expires_at > self.store.now()).alias('live')
        return (
            AiResponseCache.select(AiResponseCache, live)
            .where(AiResponseCache.cache_key == key)
            .first()
        )

    def _claim(self, call, key, found, timeout_ms):
        """Make this job the one that calls the provider for ``key``: a new claim, or the
        expired row (or this job's own claim, from an earlier attempt) taken over by
        compare-and-set. False when another job got there first."""
        expires = self.store.now_plus_ms(timeout_ms + self.claim_margin_ms)
        claim = {
            AiResponseCache.owner_job_id: call.job.id,
            AiResponseCache.output: None,
            AiResponseCache.created_at: self.store.now(),
            AiResponseCache.expires_at: expires,
        }
        if found is None:
            try:
                AiResponseCache.insert(
                    {
                        **claim,
                        AiResponseCache.cache_key: key,
                        AiResponseCache.job_type: call.job.job_type,
                        AiResponseCache.model: '',
                        AiResponseCache.prompt_tokens: 0,
                        AiResponseCache.completion_tokens: 0,
                    }
                ).execute()
                return True
            except IntegrityError:
                return False
        taken = (AiResponseCache.expires_at <= self.store.now()) | (
            (AiResponseCache.owner_job_id == call.job.id) & AiResponseCache.output.is_null()
        )
        updated = (
            AiResponseCache.update(claim)
            .where((AiResponseCache.cache_key == key) & taken)
            .execute()
        )
        return updated == 1

    def _hit(self, call, key, found):
        saved = Usage(found.prompt_tokens, found.completion_tokens)
        call.notes[NOTE] = _Note(key, 'hit', found.owner_job_id, saved)
        self.signals.cache_lookup(call.job.job_type, hit=True)
        # No tokens used: the usage row (and every guard's settle) sees a call that cost nothing.
        return ProviderResult(output=found.output, usage=Usage(), model=found.model or call.model)

    def _miss(self, call, key, state):
        call.notes[NOTE] = _Note(key, state)
        self.signals.cache_lookup(call.job.job_type, hit=False)
        return None

    def _check_cancel(self, call):
        """A job waiting for an identical call stops when its owner cancels it."""
        requested = AiJob.select(AiJob.cancel_requested_at).where(AiJob.id == call.job.id).scalar()
        if requested is not None:
            raise JobCancelledError('cancel requested while waiting for the response cache')

    # ---------------------------------------------------------------- after it
    def after(self, call, usage, failure):
        """A claimed call that failed (or was deferred by a later guard) gives the key up at
        once, so the jobs waiting for it do not wait for the claim to expire."""
        note = call.notes.get(NOTE)
        if note is None or note.state != 'claimed':
            return
        if failure is not None:
            self._guarded_release(call, note)
        else:
            with self._answered_lock:
                self._answered[note.key] = threading.get_ident()

    def settle(self, call, usage, cost, error_code):
        """In the transaction of the call's usage row: the entry of a successful call (when
        that is the PROJECT transaction), the ``cache_hit`` event of a hit; a call that failed
        after all gives up its claim, and a hit whose output failed the job's checks takes
        the entry out so the next call asks the provider."""
        note = call.notes.get(NOTE)
        if note is None:
            return
        if note.state == 'claimed':
            with self._answered_lock:
                self._answered.pop(note.key, None)
        committing = error_code is None and self.store.in_transaction()
        if note.state == 'hit':
            if committing:
                self._record_hit(call, note)
            elif error_code is not None and error_code.startswith(OUTPUT_REJECTED):
                AiResponseCache.delete().where(
                    (AiResponseCache.cache_key == note.key)
                    & (AiResponseCache.owner_job_id == note.source_job_id)
                ).execute()
        elif committing and call.result is not None and not call.cached:
            self._write_entry(call, note, usage)
        elif note.state == 'claimed':
            self._release(call, note)

    def _write_entry(self, call, note, usage):
        values = {
            AiResponseCache.cache_key: note.key,
            AiResponseCache.job_type: call.job.job_type,
            AiResponseCache.owner_job_id: call.job.id,
            AiResponseCache.output: call.result.output,
            AiResponseCache.model: call.result.model or call.model or '',
            AiResponseCache.prompt_tokens: usage.prompt_tokens,
            AiResponseCache.completion_tokens: usage.completion_tokens,
            AiResponseCache.created_at: self.store.now(),
            AiResponseCache.expires_at: self.store.now_plus_ms(call.definition.cache.ttl_ms),
        }
        # An upsert: the row is this job's claim, or (after a long call) another's, or gone.
        update = [field for field in values if field is not AiResponseCache.cache_key]
        target = [AiResponseCache.cache_key] if self.store.dialect == 'sqlite' else None
        AiResponseCache.insert(values).on_conflict(
            conflict_target=target, preserve=update
        ).execute()

    def _record_hit(self, call, note):
        detail = {
            'scope': call.definition.cache.scope,
            'provider': call.provider_key,
            'model': call.model,
            'sourceJobId': note.source_job_id,
            'savedPromptTokens': note.saved.prompt_tokens,
            'savedCompletionTokens': note.saved.completion_tokens,
        }
        insert_events(self.store, [NewEvent(call.job.id, CACHE_HIT, call.job.attempt_no, detail)])

    def _release(self, call, note):
        AiResponseCache.delete().where(
            (AiResponseCache.cache_key == note.key)
            & (AiResponseCache.owner_job_id == call.job.id)
            & AiResponseCache.output.is_null()
        ).execute()

    def _guarded_release(self, call, note):
        """``_release`` outside any transaction: a store outage only leaves the claim to
        expire."""
        try:
            with self._unit():
                self._release(call, note)
        except Exception as exc:
            if not self.store.is_unreachable(exc):
                raise
            log_event('cache.release_failed', logging.WARNING, job_id=call.job.id)


def purge_expired(limit=1000):
    """Delete up to ``limit`` expired rows (entries and abandoned claims); returns how many.
    Runs in the purger's unit of work."""
    keys = [
        row.cache_key
        for row in AiResponseCache.select(AiResponseCache.cache_key)
        .where(AiResponseCache.expires_at <= db_now())
        .limit(limit)
    ]
    if not keys:
        return 0
    return (
        AiResponseCache.delete()
        .where(AiResponseCache.cache_key.in_(keys) & (AiResponseCache.expires_at <= db_now()))
        .execute()
    )
