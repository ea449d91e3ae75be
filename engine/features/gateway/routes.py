"""Routes and fallback: which provider/model each call of a job goes to (docs/architecture.md,
decision 17).

A job runs on its definition's route (``JobDefinition.route``), else on the route of the
provider its definition names, else on the default route; a definition whose provider is a
plugin's own (the synthetic one) is not routed. Each attempt of a job keeps its place in the
route (``RouteState``, on the engine's Attempt), and the place moves:

- after a retryable failure of the provider (timeout, refused connection, 5xx, 429): the next
  call goes to the next entry;
- after malformed output: once more to the same entry (its own retry), then to the next;
- after ``context length exceeded``: to the next entry whose model has a larger context (the
  failure becomes retryable when there is one);
- when the entry cannot take the call now (its cooldown, or a guard's EntryUnavailable): to
  the next entry at once, and when none is left the job waits for the shortest delay.

Non-retryable failures (a refused key, content safety, a bad request) never move it. A job on a
user's own key stays on that user's provider. Each move leaves a ``fallback`` row in the job's
history: with the failed call's usage row, or in a transaction of its own when an entry was
skipped before any call."""

import contextlib
import dataclasses
import logging

from ...core import history
from ...core.errors import ConfigError
from ...core.history import NewEvent, insert_events
from ...core.logs import log_event
from ...execution.providers import AiGateway, CallGuard, Credential, ProviderCall
from .openai_client import OpenAICompatibleProvider, prompt_measures
from .providers_config import SHORTHAND_PROVIDER, Entry

CONTEXT_LENGTH = 'PROVIDER_BAD_REQUEST_CONTEXT_LENGTH'
VALIDATION_STRIKES = 2  # malformed output: the entry's own retry, then the next entry


class RouteState:
    """One attempt's place in its route: the entries it may use (a user's key: only its
    provider's), where it stands, and what moved it."""

    def __init__(self, entries):
        self.entries = tuple(entries)
        self.index = 0
        self.strikes = 0  # malformed outputs in a row on the current entry
        self.delays = []  # seconds each skipped entry of this call is unavailable for
        self._moves = {}  # call number -> the move its outcome made (None: none)

    def position(self, call):
        return self.entries.index(Entry(call.provider_key, call.model))

    def has_next(self, index):
        return index + 1 < len(self.entries)

    def move_after(self, call, error_code, models):
        """Where the call after ``call`` goes, given how ``call`` ended: (from, to) Entries
        when the place moved, else None. Decided once per call: a write that is tried again
        (the store was away, a group commit ran again) gets the same answer, so its row."""
        if call.call_no not in self._moves:
            self._moves[call.call_no] = self._move(call, error_code, models)
        return self._moves[call.call_no]

    def _move(self, call, error_code, models):
        here = self.position(call)
        if error_code is None:
            self.strikes = 0
            return None
        if not _will_retry(call, error_code):
            return None
        target = self._target(here, error_code, models)
        if target is None:
            return None
        self.index, self.strikes = target, 0
        return self.entries[here], self.entries[target]

    def _target(self, here, error_code, models):
        if error_code == CONTEXT_LENGTH:
            return self.larger_context(here, models)
        if error_code.startswith('VALIDATION_'):
            self.strikes += 1
            if self.strikes < VALIDATION_STRIKES:
                return None
        elif not _moves_on(error_code):
            return None
        return here + 1 if self.has_next(here) else None

    def larger_context(self, here, models):
        """The first entry after ``here`` whose model has a larger context, or None."""
        current = models(self.entries[here]).context or 0
        for index in range(here + 1, len(self.entries)):
            context = models(self.entries[index]).context
            if context is not None and context > current:
                return index
        return None


def _moves_on(error_code):
    """Failures of the provider itself: the next call tries the next entry."""
    if error_code == 'TIMEOUT':
        return True
    return error_code.startswith('PROVIDER_') and not error_code.startswith('PROVIDER_BAD_REQUEST')


def _will_retry(call, error_code):
    """Will the engine make another call after this failure? (The engine decides; this
    mirrors its rule so the history names a move only when a call follows.)"""
    if call.call_no > call.job.max_retry_count:
        return False
    if error_code == 'TIMEOUT':
        return call.definition.execution.abort_strategy == 'retry'
    return (
        error_code == CONTEXT_LENGTH
        or _moves_on(error_code)
        or error_code.startswith('VALIDATION_')
    )


class RoutedGateway(AiGateway):
    """The gateway of AIJOB_PROVIDERS (or the one-provider shorthand): one OpenAI-compatible
    client per provider, routes of provider/model entries, the prices and limits of each.
    ``default_max_tokens``: the completion cap of an entry that sets no ``maxTokens``
    (AIJOB_BUDGET_MAX_TOKENS), sent with its calls so no call writes more than a budget
    reserved for it."""

    def __init__(self, base, table, pricing, prompts, cooldowns, store, default_max_tokens):
        # The plugins' own providers (synthetic, …) stay, for the definitions that name them.
        super().__init__(base.providers(), default_provider=base.default_provider)
        self.table = table
        self.pricing = pricing
        self.cooldowns = cooldowns
        self.store = store
        self.default_max_tokens = default_max_tokens
        for spec in table.routed():
            self.add(
                OpenAICompatibleProvider(
                    spec.base_url,
                    next(iter(spec.models)),
                    prompts=prompts,
                    key=spec.name,
                    read_timeout_s=spec.read_timeout_ms / 1000.0,
                    needs_api_key=spec.api_key_env is not None,
                )
            )

    # ---------------------------------------------------------------- which route
    def route_entries(self, definition):
        """The entries a job of ``definition`` may use, in order, or None when it is not
        routed (its provider is a plugin's own)."""
        table = self.table
        if definition.route is not None:
            return table.routes.get(definition.route)
        spec = table.providers.get(definition.provider)
        if spec is not None and spec.routed:
            return tuple(Entry(spec.name, model) for model in spec.models)
        if definition.provider in (None, SHORTHAND_PROVIDER) and table.default_route is not None:
            return table.routes[table.default_route]
        return None

    def check_definitions(self, definitions):
        for definition in definitions:
            if definition.route is not None and definition.route not in self.table.routes:
                raise ConfigError(
                    '%s is invalid: job type %s names route %r, which it does not define '
                    '(routes: %s)'
                    % (
                        self.table.source,
                        definition.job_type,
                        definition.route,
                        ', '.join(self.table.routes),
                    )
                )

    def provider_for(self, definition):
        entries = self.route_entries(definition)
        if entries is None:
            return super().provider_for(definition)
        return self._providers[entries[0].provider]

    def platform_available(self, definition, platform_key_configured):
        entries = self.route_entries(definition)
        if entries is None:
            return super().platform_available(definition, platform_key_configured)
        return any(self._usable(entry.provider) for entry in entries)

    def _usable(self, provider):
        return not self.table.needs_key(provider) or bool(self.table.key_of(provider))

    def route(self, definition, job):
        entries = self.route_entries(definition)
        if entries is None:
            return super().route(definition, job)
        return self._providers[entries[0].provider], entries[0].model

    def _chain(self, entries, credential):
        """A user's own key works with its provider only: the entries of the provider it was
        registered for (else the route's first provider)."""
        if credential.mode == 'platform_key':
            return entries
        providers = [entry.provider for entry in entries]
        own = credential.provider if credential.provider in providers else providers[0]
        return tuple(entry for entry in entries if entry.provider == own)

    # ---------------------------------------------------------------- each call
    def prepare_call(self, attempt, resolved, request):
        entries = self.route_entries(attempt.definition)
        if entries is None:
            return super().prepare_call(attempt, resolved, request)
        state = attempt.route
        if state is None:
            state = attempt.route = RouteState(self._chain(entries, request.credential))
        state.delays = []
        return self._call_for(attempt, request, state, state.index)

    def next_entry(self, attempt, call, unavailable):
        state = call.notes.get('route')
        if state is None:
            return None
        state.delays.append(unavailable.delay_s)
        here = state.position(call)
        if not state.has_next(here):
            # Every entry after the place is unavailable: the job waits for the soonest.
            unavailable.delay_s = min(state.delays)
            return None
        state.index, state.strikes = here + 1, 0
        following = self._call_for(attempt, call.request, state, here + 1)
        code = unavailable.detail.get('errorCode') or unavailable.reason
        self._record_skip(call, state.entries[here], state.entries[here + 1], code)
        return following

    def _call_for(self, attempt, request, state, index):
        entry = state.entries[index]
        spec = self.table.model(entry)
        max_tokens = spec.max_tokens or self.default_max_tokens
        request = dataclasses.replace(
            request,
            model=entry.model,
            max_tokens=max_tokens,
            credential=self._credential(request.credential, entry.provider),
        )
        provider = self._providers[entry.provider]
        prompt_tokens, prompt_token_bound = prompt_measures(provider, request)  # one rendering
        call = ProviderCall(
            job=attempt.job,
            definition=attempt.definition,
            request=request,
            provider=provider,
            model=entry.model,
            call_no=request.attempt,
            max_tokens=max_tokens,
            prompt_tokens=prompt_tokens,
            prompt_token_bound=prompt_token_bound,
            price=self.pricing.price(entry.provider, entry.model),
            limits=spec.limits,
            has_next_entry=state.has_next(index),
        )
        call.notes['route'] = state
        return call

    def _credential(self, credential, provider):
        """The platform's calls use each provider's own key; a user's key stays the user's."""
        if credential.mode != 'platform_key':
            return credential
        return Credential('platform_key', self.table.key_of(provider))

    def _record_skip(self, call, source, target, code):
        """A ``fallback`` row for an entry skipped before any call to it: in a transaction of
        its own (no usage row comes with it). The history is a record: an unreachable store
        does not stop the job."""
        event = _fallback_event(call, source, target, code)
        unit = self.store.connection if self.store.dialect == 'mysql' else contextlib.nullcontext
        try:
            with unit():
                self.store.run_in_transaction(lambda tx: insert_events(self.store, [event]))
        except Exception as exc:
            if not self.store.is_unreachable(exc):
                raise
            log_event('gateway.fallback_unrecorded', logging.WARNING, job_id=call.job.id)

    def cooldown_state(self):
        """{'provider/model': seconds of cooldown left} of every configured entry."""
        return self.cooldowns.remaining(entry.key for entry in self.table.entries())


def _fallback_event(call, source, target, code):
    detail = {'from': source.key, 'to': target.key, 'errorCode': code}
    return NewEvent(call.job.id, history.FALLBACK, call.job.attempt_no, detail)


class FallbackGuard(CallGuard):
    """Moves a routed job's place after each call: ``after`` makes a context-length failure
    retryable when a larger model follows in the route, and drops the Retry-After of a failure
    whose next call goes to another entry; ``settle``, in the transaction of the call's usage
    row, moves the place and writes the ``fallback`` row."""

    name = 'fallback'

    def __init__(self, gateway, store):
        self.gateway = gateway
        self.store = store

    def after(self, call, usage, failure):
        state = call.notes.get('route')
        code = getattr(failure, 'code', None)
        if state is None or code is None:
            return
        here = state.position(call)
        if code == CONTEXT_LENGTH:
            if state.larger_context(here, self.gateway.table.model) is not None:
                failure.retryable = True  # another model can take it: worth a call
        elif _moves_on(code) and state.has_next(here):
            # The next call goes to another entry: this one's Retry-After is not its wait.
            failure.retry_after_s = None

    def settle(self, call, usage, cost, error_code):
        state = call.notes.get('route')
        if state is None:
            return
        moved = state.move_after(call, error_code, self.gateway.table.model)
        if moved is None:
            return
        source, target = moved
        log_event(
            'gateway.fallback',
            job_id=call.job.id,
            source=source.key,
            target=target.key,
            error_code=error_code,
        )
        insert_events(self.store, [_fallback_event(call, source, target, error_code)])
