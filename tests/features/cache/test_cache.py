"""The response cache (issue 21, item 6; engine/features/cache/guard.py), against the loopback
OpenAI-compatible server: a hit costs 0 and projects again; scope ``user`` keeps users apart and
``global`` does not; entries survive a restart; an expired entry misses and the purger removes it;
``noCache`` skips the cache; identical jobs at once make one provider call; the counters in
/metrics. Definitions without a cache policy add no guard."""

import base64
import dataclasses
import threading
import time
from decimal import Decimal

import pytest

from engine.core.errors import InvalidDefinitionError, InvalidRequestError
from engine.core.history import JobHistory
from engine.core.models import AiArtifact, AiJob, AiJobArtifact, AiUsageLog
from engine.core.registry import CachePolicy, JobDefinitionRegistry, validate_definition
from engine.core.states import TERMINAL
from engine.execution.engine import ExecutionEngine
from engine.execution.providers import Credential, ProviderCall, ProviderRequest, Usage
from engine.features.cache import guard as cache_module
from engine.features.cache.guard import CacheGuard
from engine.features.cache.models import AiResponseCache
from engine.features.metrics.scrape import scrape
from engine.jobtypes.flashcards import FlashcardProjector, flashcard_definition
from engine.jobtypes.synthetic import synthetic_definition
from tests.features.metrics.test_metrics import parse, value
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers
from tests.support.cached_jobs import CACHED_CARDS
from tests.support.fake_openai import error_reply, json_reply
from tests.support.helpers import create_job, wait_until
from tests.support.provider_configs import one_provider
from tests.support.worker_processes import Worker

CARDS = {'cards': [{'question': 'Capital of France?', 'answer': 'Paris'}]}
TEXT = 'Paris is the capital of France.'
SETTINGS = {
    'AIJOB_PLATFORM_API_KEY': 'sk-platform-cache-1f2e3d4c',
    'AIJOB_CREDENTIAL_MASTER_KEY': base64.b64encode(b'c' * 32).decode(),
    'AIJOB_LOCK_TTL_MS': '3000',
    'AIJOB_HEARTBEAT_MS': '300',
    'AIJOB_OUTBOX_POLL_MS': '100',
    'AIJOB_SHUTDOWN_GRACE_MS': '3000',
    'AIJOB_INTERACTIVE_CONCURRENCY': '4',
}
PRICE = {'prompt': '2', 'completion': '10', 'per': 1000}  # fake-model's


def provider(base_url):
    """The shorthand's provider at ``base_url``, its model priced."""
    return one_provider(base_url, price=PRICE)


USER_TYPE, GLOBAL_TYPE, SHORT_TYPE = 'cards_cached', 'cards_shared', 'cards_short_ttl'


def cached(job_type, ttl_ms=600_000, scope='user'):
    definition = flashcard_definition(job_type=job_type, timeout_ms=10_000, backoff_ms=20)
    return dataclasses.replace(definition, cache=CachePolicy(ttl_ms, scope))


def registry():
    reg = JobDefinitionRegistry()
    reg.register(flashcard_definition(timeout_ms=10_000, backoff_ms=20))  # no cache policy
    reg.register(cached(USER_TYPE))
    reg.register(cached(GLOBAL_TYPE, scope='global'))
    reg.register(cached(SHORT_TYPE, ttl_ms=300))
    return reg


class CountingProjector(FlashcardProjector):
    """The flashcards projector, counting the jobs it projected."""

    def __init__(self):
        self.projected = []

    def project(self, tx, job, validated_output):
        self.projected.append(job.id)
        return super().project(tx, job, validated_output)


@pytest.fixture
def start(make_runtime, fake):
    """``start(**settings)``: a runtime on the test backend with the fake provider, running its
    workers (stopped at the end); several calls make several runtimes on one database (a
    restart, with other settings if given)."""
    started = []

    def make(**settings):
        runtime = make_runtime(
            registry=registry(),
            **provider(fake.base_url),
            **dict(SETTINGS, **settings),
        )
        runtime.projector = CountingProjector()
        runtime.ai.projectors.add(runtime.projector)
        runtime.start_background()
        started.append(runtime)
        return runtime

    fake.script(json_reply(CARDS))
    yield make
    for runtime in started:
        runtime.stop_background(timeout_s=5)


def run(runtime, job_type=USER_TYPE, user_id='user-a', overrides=None, text=TEXT):
    job = create_job(
        runtime,
        job_type=job_type,
        user_id=user_id,
        input={'text': text, 'maxCards': 3},
        overrides=overrides or {},
    )
    return wait_terminal(job.id)


def wait_terminal(job_id, timeout=20.0):
    def terminal():
        job = AiJob.get_by_id(job_id)
        return job if job.lifecycle_status in TERMINAL else None

    return wait_until(terminal, timeout=timeout)


def usage(job):
    [row] = AiUsageLog.select().where(AiUsageLog.job_id == job.id)
    return row


def cards_of(job):
    links = AiJobArtifact.select().where(AiJobArtifact.job_id == job.id)
    return [AiArtifact.get_by_id(link.artifact_id).content for link in links]


def kinds(runtime, job):
    return [event.kind for event in JobHistory(runtime.store).list(job.id)]


def counter(runtime, name, job_type):
    return value(parse(scrape(runtime).decode()), name, job_type=job_type)


def test_a_hit_costs_nothing_and_projects_again(start, fake):
    runtime = start()
    with runtime.store.connection():
        hits = counter(runtime, 'aijob_cache_hits_total', USER_TYPE)
        misses = counter(runtime, 'aijob_cache_misses_total', USER_TYPE)
        first = run(runtime)
        second = run(runtime)
        assert (first.lifecycle_status, second.lifecycle_status) == ('succeeded', 'succeeded')
        assert len(fake.requests) == 1  # the second job called no provider
        paid, free = usage(first), usage(second)
        assert (paid.cached, Decimal(paid.cost)) == (False, Decimal('0.092'))
        assert (free.cached, Decimal(free.cost), free.error_code) == (True, Decimal(0), None)
        assert (free.provider, free.model) == ('openai', 'fake-model')
        assert (free.prompt_tokens, free.completion_tokens) == (0, 0)  # nothing was used
        # The same validation and projection as a provider's answer: the projector ran for
        # both jobs, and each has its own artifacts with the same content.
        assert runtime.projector.projected == [first.id, second.id]
        assert cards_of(first) == cards_of(second) == CARDS['cards']
        assert second.output_hash == first.output_hash
        assert 'cache_hit' in kinds(runtime, second) and 'cache_hit' not in kinds(runtime, first)
        [event] = [e for e in JobHistory(runtime.store).list(second.id) if e.kind == 'cache_hit']
        assert event.admin()['detail']['sourceJobId'] == first.id
        assert event.public()['detail'] == {
            'scope': 'user',
            'provider': 'openai',
            'model': 'fake-model',
            'savedPromptTokens': 11,
            'savedCompletionTokens': 7,
        }
        assert 'sourceJobId' not in event.public()['detail']
        assert counter(runtime, 'aijob_cache_hits_total', USER_TYPE) == hits + 1
        assert counter(runtime, 'aijob_cache_misses_total', USER_TYPE) == misses + 1


@pytest.mark.slow
def test_scope_user_keeps_users_apart_and_global_shares(start, fake):
    runtime = start()
    with runtime.store.connection():
        run(runtime, USER_TYPE, user_id='user-a')
        other = run(runtime, USER_TYPE, user_id='user-b')
        assert len(fake.requests) == 2 and usage(other).cached is False
        run(runtime, GLOBAL_TYPE, user_id='user-a')
        shared = run(runtime, GLOBAL_TYPE, user_id='user-b')
        assert len(fake.requests) == 3 and usage(shared).cached is True
        assert cards_of(shared) == CARDS['cards']
        # Another input is another key, in any scope.
        run(runtime, GLOBAL_TYPE, user_id='user-b', text='Rome is the capital of Italy.')
        assert len(fake.requests) == 4


@pytest.mark.slow
def test_entries_survive_a_restart(start, fake):
    runtime = start()
    with runtime.store.connection():
        run(runtime)
    runtime.stop_background(timeout_s=5)
    again = start()  # a new process on the same database
    with again.store.connection():
        job = run(again)
        assert job.lifecycle_status == 'succeeded' and usage(job).cached is True
        assert len(fake.requests) == 1


def test_an_expired_entry_misses_and_the_purger_removes_it(start, fake):
    runtime = start()
    with runtime.store.connection():
        run(runtime, SHORT_TYPE)
        wait_until(lambda: not live_entries(runtime), timeout=5)
        late = run(runtime, SHORT_TYPE)
        assert usage(late).cached is False and len(fake.requests) == 2
        assert AiResponseCache.select().count() == 1  # the expired row was taken over
        wait_until(lambda: not live_entries(runtime), timeout=5)
        assert runtime.purger.sweep()['cache_entries'] == 1
        assert AiResponseCache.select().count() == 0


def live_entries(runtime):
    return AiResponseCache.select().where(AiResponseCache.expires_at > runtime.store.now()).count()


@pytest.mark.slow
def test_a_cached_answer_that_fails_the_jobs_checks_is_removed(start, fake):
    """A safety pattern added since the answer was cached blocks it: the job fails as it would
    with the provider's answer, and the entry goes, so the next call asks the provider."""
    runtime = start()
    with runtime.store.connection():
        run(runtime)
    runtime.stop_background(timeout_s=5)
    stricter = start(AIJOB_CONTENT_SAFETY_PATTERNS=r'["France\\?"]')  # in the output only
    with stricter.store.connection():
        job = run(stricter)
        assert (job.lifecycle_status, job.error_code) == ('failed', 'CONTENT_SAFETY_BLOCKED')
        assert (usage(job).cached, usage(job).error_code) == (True, 'CONTENT_SAFETY_BLOCKED')
        assert AiResponseCache.select().count() == 0 and len(fake.requests) == 1
        run(stricter)
        assert len(fake.requests) == 2


def test_no_cache_neither_reads_nor_writes_the_cache(start, fake):
    runtime = start()
    with runtime.store.connection():
        skipped = run(runtime, overrides={'noCache': True})
        assert usage(skipped).cached is False and AiResponseCache.select().count() == 0
        first = run(runtime)
        again = run(runtime, overrides={'noCache': True})
        assert usage(again).cached is False and len(fake.requests) == 3
        [entry] = AiResponseCache.select()
        assert entry.owner_job_id == first.id
        with pytest.raises(InvalidRequestError) as refused:
            create_job(runtime, job_type=USER_TYPE, input={'text': TEXT}, overrides={'noCache': 1})
        assert refused.value.field == 'overrides.noCache'


@pytest.mark.slow
def test_identical_jobs_at_once_make_one_provider_call(start, fake):
    fake.script(json_reply(CARDS, first_delay_s=0.5))  # long enough for all of them to start
    runtime = start()
    with runtime.store.connection():
        hits = counter(runtime, 'aijob_cache_hits_total', USER_TYPE)
        jobs = [
            create_job(runtime, job_type=USER_TYPE, input={'text': TEXT, 'maxCards': 3})
            for _ in range(4)
        ]
        done = [wait_terminal(job.id) for job in jobs]
        assert [job.lifecycle_status for job in done] == ['succeeded'] * 4
        assert len(fake.requests) == 1
        assert sorted(usage(job).cached for job in done) == [False, True, True, True]
        assert all(cards_of(job) == CARDS['cards'] for job in done)
        assert counter(runtime, 'aijob_cache_hits_total', USER_TYPE) == hits + 3


def test_a_failed_call_releases_its_claim_for_the_jobs_waiting(start, fake):
    """The first job's call fails for good: the job waiting for it calls the provider itself at
    once (it does not wait for the claim to expire) and writes the entry."""
    fake.script(error_reply(400, 'bad request', first_delay_s=0.5), json_reply(CARDS))
    runtime = start()
    with runtime.store.connection():
        jobs = [
            create_job(runtime, job_type=USER_TYPE, input={'text': TEXT, 'maxCards': 3})
            for _ in range(2)
        ]
        done = sorted((wait_terminal(job.id) for job in jobs), key=lambda j: j.lifecycle_status)
        assert [job.lifecycle_status for job in done] == ['failed', 'succeeded']
        assert len(fake.requests) == 2
        [entry] = AiResponseCache.select()
        assert entry.owner_job_id == done[1].id and entry.output == CARDS


def test_single_flight_across_guards_on_two_threads(make_runtime):
    """Two workers' guards on one identical call: the first claims, the second waits and is
    answered by the entry the first writes in its transaction."""
    runtime = make_runtime(registry=registry(), **provider('http://127.0.0.1:9/v1'), **SETTINGS)
    with runtime.store.connection():
        definition = runtime.registry.get(GLOBAL_TYPE)
        owner, waiter = CacheGuard(runtime.store), CacheGuard(runtime.store, poll_s=0.01)
        calls = [fake_call(runtime, definition, 'job-%d' % i) for i in range(2)]
        assert owner.before(calls[0]) is None  # claimed: this one calls the provider
        answered = []
        thread = threading.Thread(target=lambda: answered.append(wait_for(runtime, waiter, calls)))
        thread.start()
        thread.join(0.3)
        assert thread.is_alive() and not answered  # waiting for the claim's answer
        calls[0].result = FakeResult(CARDS)
        runtime.store.run_in_transaction(
            lambda tx: owner.settle(calls[0], FakeResult(CARDS).usage, Decimal(0), None)
        )
        thread.join(5)
        [result] = answered
        assert result.output == CARDS and calls[1].notes['cache'].source_job_id == 'job-0'


def wait_for(runtime, guard, calls):
    with runtime.store.connection():
        return guard.before(calls[1])


@dataclasses.dataclass
class FakeResult:
    output: dict
    model: str = 'fake-model'

    @property
    def usage(self):
        return Usage(3, 4)


def fake_call(runtime, definition, job_id):
    """A ProviderCall as the engine makes it, for a job that exists only in memory."""
    job = AiJob(id=job_id, job_type=definition.job_type, user_id='user-a', attempt_no=1)
    request = ProviderRequest(
        job_id=job_id,
        job_type=definition.job_type,
        attempt=1,
        input={'text': TEXT},
        definition=definition,
        credential=Credential('platform_key'),
    )
    provider = runtime.ai.gateway.provider_for(definition)
    return ProviderCall(job, definition, request, provider, 'fake-model', 1)


def test_no_guard_without_a_cache_policy(make_runtime, fake):
    plain = JobDefinitionRegistry()
    plain.register(flashcard_definition())
    runtime = make_runtime(registry=plain, **provider(fake.base_url), **SETTINGS)
    assert not any(isinstance(guard, CacheGuard) for guard in runtime.ai.guards)
    cached_runtime = make_runtime(registry=registry(), **provider(fake.base_url), **SETTINGS)
    guards = [type(guard) for guard in cached_runtime.ai.guards]
    # first: a hit reserves nothing
    assert guards[0] is CacheGuard and guards.count(CacheGuard) == 1


@pytest.mark.parametrize(
    'policy',
    [CachePolicy(0), CachePolicy(-5), CachePolicy(True), CachePolicy(1000, 'team'), 'cache'],
)
def test_a_bad_cache_policy_stops_start_up(policy):
    definition = dataclasses.replace(flashcard_definition(), cache=policy)
    with pytest.raises(InvalidDefinitionError):
        validate_definition(definition)
    validate_definition(dataclasses.replace(flashcard_definition(), cache=CachePolicy(1000)))


@pytest.mark.slow
def test_identical_jobs_on_two_worker_processes_make_one_provider_call(
    make_runtime, backend, fake, tmp_path
):
    """Two ``python aijob.py worker`` processes (two threads each) on the shared store and Redis
    run six identical jobs of three users while the provider takes its time: one call."""
    require_servers('redis')
    env = dict(
        SETTINGS,
        **provider(fake.base_url),
        AIJOB_DEFINITIONS='tests.support.cached_jobs',
        AIJOB_INTERACTIVE_CONCURRENCY='2',
        AIJOB_MAX_ACTIVE_JOBS_PER_USER='0',
        AIJOB_DAILY_JOB_QUOTA='0',
    )
    fake.script(json_reply(CARDS, first_delay_s=1.0))
    runtime = make_runtime(AIJOB_REDIS_URL=REDIS_URL, **env)
    workers = [Worker(tmp_path, backend.env(AIJOB_REDIS_URL=REDIS_URL, **env)) for _ in range(2)]
    try:
        with runtime.store.connection():
            jobs = [
                create_job(
                    runtime,
                    job_type=CACHED_CARDS.job_type,
                    user_id='user-%d' % (i % 3),
                    input={'text': TEXT, 'maxCards': 3},
                )
                for i in range(6)
            ]
            done = [wait_terminal(job.id, timeout=40) for job in jobs]
            assert [job.lifecycle_status for job in done] == ['succeeded'] * 6
            assert len(fake.requests) == 1
            assert sorted(usage(job).cached for job in done) == [False] + [True] * 5
            ran_on = {job.locked_by.split(':')[2] for job in done}
            assert len(ran_on) == 2, 'both worker processes ran some of the jobs'
    finally:
        for worker in workers:
            worker.close()
        delete_redis_keys(backend.prefix)


def test_identical_jobs_of_one_batch_do_not_wait_for_each_other(make_engine_rt, monkeypatch):
    """A worker thread runs a batch of jobs and commits their successes together at its end: a
    job of the batch identical to an earlier one must not wait for that one's entry (it is this
    thread's to commit), so it calls the provider itself. The synthetic provider, which keeps no
    templates, is cached by its input."""
    rt = make_engine_rt(dataclasses.replace(synthetic_definition(), cache=CachePolicy(60_000)))
    waits = []
    monkeypatch.setattr(cache_module, 'time', CountingSleep(waits))
    ids = [create_job(rt, input={'output': {'n': 1}}).id for _ in range(3)]
    statuses = ExecutionEngine(rt, 'worker-batch').execute_batch(ids)
    assert statuses == {job_id: 'succeeded' for job_id in ids} and waits == []
    assert [usage(AiJob.get_by_id(job_id)).cached for job_id in ids] == [False] * 3
    [entry] = AiResponseCache.select()
    assert entry.output == {'n': 1}
    # The next job, in another batch, is answered from the entry.
    [later] = [create_job(rt, input={'output': {'n': 1}}).id]
    assert ExecutionEngine(rt, 'worker-next').execute_batch([later]) == {later: 'succeeded'}
    assert usage(AiJob.get_by_id(later)).cached is True


class CountingSleep:
    """The cache module's ``time``, with each sleep (a wait for another job's entry) counted."""

    def __init__(self, sleeps):
        self.sleeps = sleeps
        self.monotonic = time.monotonic

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        time.sleep(seconds)
