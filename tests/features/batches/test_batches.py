"""Provider batches (issue 22 items 1-4), in process on each backend pair against the fake batch
API: jobs of an opted-in definition are parked, sent in batches of ``max_jobs``, answered at the
batch price (half) with the batch id on each usage row, and projected once; a failed line is
retried in a later batch; an expired batch's jobs finish online; a cancelled job ends at once
and a batch whose jobs were all cancelled is cancelled at the provider; budgets hold a parked
job's reservation; and every step run again after it was cut short sends nothing twice."""

import dataclasses
import datetime
import json
from decimal import Decimal

import pytest

from engine.core.errors import ConfigError, InvalidDefinitionError
from engine.core.history import BATCH_SUBMITTED, SUCCEEDED
from engine.core.models import AiJob, AiJobArtifact, AiJobEvent, AiUsageLog, OutboxEvent
from engine.core.registry import BatchPolicy, QueuePolicy, validate_definition
from engine.core.states import TERMINAL
from engine.execution.engine import ExecutionEngine
from engine.features.batches.models import AiProviderBatch, AiProviderBatchItem
from engine.features.budgets.models import AiBudgetReservation, AiBudgetSpend
from engine.features.gateway import providers_config
from engine.features.gateway.providers_config import Entry
from engine.jobtypes.synthetic import synthetic_definition
from tests.support.api import Harness
from tests.support.batched_jobs import FAST_BATCHES, batched_definition, provider_settings
from tests.support.helpers import create_job, wait_until
from tests.support.routed_jobs import routed_definition
from tests.support.runtimes import FAST_SETTINGS, fast_registry

ONLINE_COST = Decimal('0.025000')  # the fake's usage (11 prompt, 7 completion) at PRICE
BATCH_COST = Decimal('0.012500')  # half: the default batch price


@pytest.fixture
def make_batch_rt(make_runtime, batch_fake):
    """``make_batch_rt(definition)``: a fast runtime whose one provider is the fake, with the
    definition ``batched`` given (default: 10 jobs a batch, 300 ms wait)."""

    def make(definition=None, **settings):
        registry = fast_registry(definition or batched_definition())
        merged = {**FAST_SETTINGS, **FAST_BATCHES, **settings}
        return make_runtime(registry=registry, **provider_settings(batch_fake.base_url, **merged))

    return make


def create_batched(rt, count, job_type='batched'):
    return [create_job(rt, job_type=job_type, input={}).id for _ in range(count)]


def all_terminal(job_ids, timeout=60.0):
    def done():
        jobs = list(AiJob.select().where(AiJob.id.in_(job_ids)))
        return jobs if all(job.lifecycle_status in TERMINAL for job in jobs) else None

    return wait_until(done, timeout=timeout)


def events_of(job_id, kind):
    return list(
        AiJobEvent.select().where((AiJobEvent.job_id == job_id) & (AiJobEvent.kind == kind))
    )


def usage_rows(job_ids):
    return list(AiUsageLog.select().where(AiUsageLog.job_id.in_(job_ids)).order_by(AiUsageLog.id))


@pytest.mark.slow
def test_200_jobs_go_in_4_batches_at_half_price_each_projected_once(make_batch_rt, batch_fake):
    # The reaper's lost wake-up path out of reach: each job is woken by its line's outcome.
    rt = make_batch_rt(
        batched_definition(max_wait_ms=600_000, max_jobs=50), AIJOB_REAP_AFTER_MS='600000'
    )
    with rt.store.connection():
        job_ids = create_batched(rt, 200)
        rt.start_background()
        jobs = all_terminal(job_ids, timeout=120.0)

        assert {job.lifecycle_status for job in jobs} == {'succeeded'}
        assert len(batch_fake.batches) == 4
        assert sorted(b['request_counts']['total'] for b in batch_fake.batches.values()) == [50] * 4
        assert len(batch_fake.submitted_custom_ids) == 200
        assert set(batch_fake.submitted_custom_ids) == {'%s:1' % job_id for job_id in job_ids}
        assert batch_fake.requests == []  # nothing went online
        rows = usage_rows(job_ids)
        assert len(rows) == 200
        assert {row.cost for row in rows} == {BATCH_COST}
        assert {row.error_code for row in rows} == {None}
        batches = list(AiProviderBatch.select())
        assert {row.batch_id for row in rows} == {b.id for b in batches}
        assert [(b.state, b.job_count, b.succeeded_count) for b in batches] == [
            ('ended', 50, 50)
        ] * 4
        assert {b.cost for b in batches} == {BATCH_COST * 50}
        for job_id in job_ids:
            assert len(events_of(job_id, SUCCEEDED)) == 1
            [submitted] = events_of(job_id, BATCH_SUBMITTED)
            assert submitted.detail['batchId'] in {b.id for b in batches}
            assert AiJobArtifact.select().where(AiJobArtifact.job_id == job_id).count() == 1
        assert (
            AiProviderBatchItem.select().where(AiProviderBatchItem.state != 'consumed').count() == 0
        )


def running_in_a_submitted_batch(rt, count):
    """``count`` jobs created and the background started: (their ids, the batch the provider has
    them in)."""
    job_ids = create_batched(rt, count)
    rt.start_background()
    wait_until(lambda: AiProviderBatch.select().where(AiProviderBatch.job_count == count).first())
    return job_ids, submitted_batch()


def submitted_batch(timeout=30.0):
    """The first batch row once the provider has it."""
    return wait_until(
        lambda: AiProviderBatch.select().where(AiProviderBatch.state == 'submitted').first(),
        timeout=timeout,
    )


@pytest.mark.slow
def test_a_failed_line_is_retried_in_a_later_batch(make_batch_rt, batch_fake):
    rt = make_batch_rt()
    with rt.store.connection():
        first, second = create_batched(rt, 2)
        batch_fake.fail_line('%s:1' % first, status_code=500, code='server_error')
        rt.start_background()
        jobs = all_terminal([first, second])

        assert [job.lifecycle_status for job in jobs] == ['succeeded', 'succeeded']
        assert sorted(batch_fake.submitted_custom_ids) == sorted(
            ['%s:1' % first, '%s:1' % second, '%s:2' % first]
        )
        failed, answered = usage_rows([first])
        assert (failed.call_no, failed.error_code, failed.cost) == (1, 'PROVIDER_ERROR', 0)
        assert (answered.call_no, answered.error_code, answered.cost) == (2, None, BATCH_COST)
        assert failed.batch_id and answered.batch_id and failed.batch_id != answered.batch_id
        assert batch_fake.requests == []  # the retry went in a batch too
        assert len(events_of(first, 'retry_scheduled')) == 1


@pytest.mark.slow
def test_an_expired_batch_sends_its_unanswered_jobs_online(make_batch_rt, batch_fake):
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        job_ids, batch = running_in_a_submitted_batch(rt, 3)
        batch_fake.expire(batch.provider_batch_id, complete_first=1)
        jobs = all_terminal(job_ids)

        assert {job.lifecycle_status for job in jobs} == {'succeeded'}
        rows = usage_rows(job_ids)
        in_batch = [row for row in rows if row.batch_id]
        online = [row for row in rows if not row.batch_id]
        assert [(row.cost, row.batch_id) for row in in_batch] == [(BATCH_COST, batch.id)]
        assert [row.cost for row in online] == [ONLINE_COST] * 2
        assert len(batch_fake.requests) == 2  # the two expired lines, online
        ended = AiProviderBatch.get_by_id(batch.id)
        assert (ended.state, ended.provider_status, ended.succeeded_count) == (
            'ended',
            'expired',
            1,
        )
        assert len(batch_fake.submitted_custom_ids) == 3


@pytest.mark.slow
def test_a_job_cancelled_in_a_batch_ends_at_once_and_its_line_is_ignored(make_batch_rt, batch_fake):
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        (kept, cancelled), batch = running_in_a_submitted_batch(rt, 2)
        api = Harness(rt)  # user-a's jobs: the status names the batch while the job waits in it
        status = api.a.get('/api/ai/jobs/%s' % kept).json
        assert (status['lifecycleStatus'], status['batchId']) == ('running', batch.id)
        assert api.b.get('/api/ai/jobs/%s' % kept).status == 404

        # Parked, its status says running; its cancel finishes it at once, so the answer is
        # 200 with the status cancelled (the code follows the status the answer carries).
        waiting = api.a.get('/api/ai/jobs/%s' % cancelled).json
        assert (waiting['lifecycleStatus'], waiting['batchId']) == ('running', batch.id)
        answer = api.a.post('/api/ai/jobs/%s/cancel' % cancelled)
        assert (answer.status, answer.json['lifecycleStatus']) == (200, 'cancelled')
        assert answer.json['errorCode'] == 'CANCELLED' and 'batchId' not in answer.json
        again = api.a.post('/api/ai/jobs/%s/cancel' % cancelled)
        assert (again.status, again.error_code) == (409, 'JOB_ALREADY_CANCELLED')
        batch_fake.set_status(batch.provider_batch_id, 'completed')
        jobs = all_terminal([kept, cancelled])

        assert [job.lifecycle_status for job in jobs] == ['succeeded', 'cancelled']
        # The provider billed the cancelled job's line: its usage row says so, and the
        # batch's cost counts it; the job never used it.
        rows = {
            row.job_id: (row.error_code, row.cost, row.batch_id)
            for row in usage_rows([kept, cancelled])
        }
        assert rows == {
            kept: (None, BATCH_COST, batch.id),
            cancelled: ('CANCELLED', BATCH_COST, batch.id),
        }
        item = AiProviderBatchItem.get(AiProviderBatchItem.job_id == cancelled)
        assert item.state == 'cancelled' and item.response is not None
        assert AiProviderBatch.get_by_id(batch.id).cost == 2 * BATCH_COST
        assert batch_fake.cancelled_batch_ids == []  # one of its jobs still wanted its line
        assert events_of(cancelled, SUCCEEDED) == []
        assert 'batchId' not in api.a.get('/api/ai/jobs/%s' % kept).json


def test_a_batch_whose_jobs_were_all_cancelled_is_cancelled_at_the_provider(
    make_batch_rt, batch_fake
):
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        job_ids, batch = running_in_a_submitted_batch(rt, 2)
        for job_id in job_ids:
            assert rt.service.cancel_job(job_id).lifecycle_status == 'cancelled'

        wait_until(lambda: batch_fake.cancelled_batch_ids == [batch.provider_batch_id])
        ended = wait_until(
            lambda: (
                AiProviderBatch.get_by_id(batch.id).state == 'ended'
                and AiProviderBatch.get_by_id(batch.id)
            )
        )
        assert (ended.provider_status, ended.succeeded_count, ended.cost) == ('cancelled', 0, 0)
        assert batch_fake.batches[batch.provider_batch_id]['status'] == 'cancelled'
        states = [item.state for item in AiProviderBatchItem.select()]
        assert states == ['cancelled', 'cancelled']
        assert usage_rows(job_ids) == []


@pytest.mark.slow
def test_a_parked_job_keeps_its_budget_reservation_and_spends_the_batch_price(
    make_batch_rt, batch_fake
):
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        rt.features['budgets'].put('global', '', 'total', Decimal('1000'), 'fail')
        job_ids, batch = running_in_a_submitted_batch(rt, 3)

        reserved = list(AiBudgetReservation.select())
        assert sorted(r.job_id for r in reserved) == sorted(job_ids)  # one per parked call
        assert rt.features['budgets'].release_leaked(0) == 0  # parked is not leaked
        [spend] = list(AiBudgetSpend.select())
        assert spend.reserved_micros == sum(r.amount_micros for r in reserved)

        batch_fake.set_status(batch.provider_batch_id, 'completed')
        all_terminal(job_ids)
        wait_until(lambda: AiBudgetReservation.select().count() == 0)
        [spend] = list(AiBudgetSpend.select())
        assert (spend.reserved_micros, spend.spent_micros) == (0, 3 * 12_500)  # half of 0.025


def test_every_step_cut_short_resumes_without_sending_anything_twice(
    make_batch_rt, batch_fake, monkeypatch
):
    rt = make_batch_rt(
        batched_definition(max_jobs=3),
        AIJOB_BATCH_RESULT_CHUNK='1',
        AIJOB_BATCH_POLL_FIRST_MS='1',  # every poll due at the next step
        AIJOB_BATCH_POLL_MAX_MS='1',
    )
    engine = ExecutionEngine(rt, 'test-worker')
    runner = rt.features['batches']
    kills = []

    def killed(obj):  # the provider did the work; the leader never hears the answer
        kills.append(obj)
        raise RuntimeError('killed')

    with rt.store.connection():
        job_ids = create_batched(rt, 3)
        assert [engine.execute(job_id) for job_id in job_ids] == ['deferred'] * 3

        batch_fake.on('upload', killed)
        runner.step()
        [batch] = list(AiProviderBatch.select())
        assert (batch.state, len(batch_fake.uploads)) == ('building', 1)

        batch_fake.on('upload', None)
        batch_fake.on('create_batch', killed)
        runner.step()  # the file is found by its name, not uploaded again
        assert (AiProviderBatch.get_by_id(batch.id).state, len(batch_fake.uploads)) == (
            'uploaded',
            1,
        )
        assert len(batch_fake.batches) == 1

        batch_fake.on('create_batch', None)
        batch_fake.mode = 'manual'
        runner.step()  # the batch is found by its metadata, not created again
        batch = AiProviderBatch.get_by_id(batch.id)
        assert batch.state == 'submitted' and len(batch_fake.batches) == 1
        assert sorted(batch_fake.submitted_custom_ids) == sorted('%s:1' % j for j in job_ids)

        batch_fake.set_status(batch.provider_batch_id, 'completed')
        batch_fake.on('retrieve_batch', killed)
        runner.step()
        batch_fake.on('retrieve_batch', None)
        batch_fake.on('content', killed)
        runner.step()
        assert (
            AiProviderBatchItem.select().where(AiProviderBatchItem.state == 'batched').count() == 3
        )

        batch_fake.on('content', None)
        write_chunk = runner.poller._write_chunk
        chunks = []

        def killed_after_one_chunk(tx, batch, pending, outcome_of):
            if chunks:
                raise RuntimeError('killed')
            chunks.append(write_chunk(tx, batch, pending, outcome_of))

        monkeypatch.setattr(runner.poller, '_write_chunk', killed_after_one_chunk)
        runner.step()  # the failure stays with the batch: logged, tried again later
        states = [
            item.state for item in AiProviderBatchItem.select().order_by(AiProviderBatchItem.id)
        ]
        assert states == ['answered', 'batched', 'batched']

        monkeypatch.undo()
        runner.step()
        assert AiProviderBatch.get_by_id(batch.id).state == 'ended'
        wakes = OutboxEvent.select().where(OutboxEvent.dedupe_key.endswith(':batch'))
        assert sorted(event.aggregate_id for event in wakes) == sorted(job_ids)  # once each

        assert [engine.execute(job_id) for job_id in job_ids] == ['succeeded'] * 3
        rows = usage_rows(job_ids)
        assert [(row.cost, row.batch_id) for row in rows] == [(BATCH_COST, batch.id)] * 3
        assert len(batch_fake.uploads) == 1 and len(batch_fake.batches) == 1
        assert len(batch_fake.submitted_custom_ids) == 3


def test_a_batch_policy_is_checked_at_registration_and_in_the_provider_file(batch_fake):
    with pytest.raises(InvalidDefinitionError, match='batch needs queue ai-background'):
        validate_definition(
            dataclasses.replace(batched_definition(), queue=QueuePolicy('ai-interactive'))
        )
    with pytest.raises(InvalidDefinitionError, match='batch.maxJobs 0 must be 1..5000'):
        validate_definition(batched_definition(max_jobs=0))
    raw = json.loads(provider_settings(batch_fake.base_url)['AIJOB_PROVIDERS'])
    model = raw['providers']['fake']['models']['fake-model']
    model['batch'] = {'maxWaitMs': 1000, 'maxJobs': 20}
    table = providers_config.parse(raw)
    assert table.model(Entry('fake', 'fake-model')).batch == BatchPolicy(1000, 20)
    model['batch'] = {'maxWaitMs': 0, 'maxJobs': 20}
    with pytest.raises(ConfigError) as refused:
        providers_config.parse(raw)
    assert 'providers.fake.models.fake-model.batch' in str(refused.value)
    assert 'maxWaitMs 0 must be 1..86400000' in str(refused.value)


@pytest.mark.slow
def test_a_route_entry_with_a_batch_policy_batches_its_background_jobs_only(
    make_runtime, batch_fake
):
    """The entry's policy opts in a definition that has none; an ai-interactive job of the
    same entry still goes online."""
    background = dataclasses.replace(
        routed_definition(job_type='plain_background'), queue=QueuePolicy('ai-background')
    )
    interactive = routed_definition(job_type='plain_interactive')
    settings = provider_settings(batch_fake.base_url, **FAST_SETTINGS, **FAST_BATCHES)
    raw = json.loads(settings['AIJOB_PROVIDERS'])
    raw['providers']['fake']['models']['fake-model']['batch'] = {'maxWaitMs': 100, 'maxJobs': 5}
    settings['AIJOB_PROVIDERS'] = json.dumps(raw)
    rt = make_runtime(registry=fast_registry(background, interactive), **settings)
    with rt.store.connection():
        parked = create_batched(rt, 2, job_type='plain_background')
        online = create_batched(rt, 1, job_type='plain_interactive')
        rt.start_background()
        jobs = all_terminal(parked + online)

        assert {job.lifecycle_status for job in jobs} == {'succeeded'}
        assert sorted(batch_fake.submitted_custom_ids) == sorted('%s:1' % j for j in parked)
        assert len(batch_fake.requests) == 1  # the interactive job's call
        costs = {row.job_id: (row.cost, bool(row.batch_id)) for row in usage_rows(parked + online)}
        assert costs == {
            parked[0]: (BATCH_COST, True),
            parked[1]: (BATCH_COST, True),
            online[0]: (ONLINE_COST, False),
        }


def test_a_batch_policy_on_a_provider_without_a_batch_api_runs_online(make_batch_rt, batch_fake):
    """The synthetic provider is no OpenAI-compatible host: its jobs are never parked."""
    synthetic = dataclasses.replace(
        synthetic_definition(job_type='synthetic_batched', queue_name='ai-background'),
        batch=BatchPolicy(max_wait_ms=1, max_jobs=1),
    )
    rt = make_batch_rt(synthetic)
    with rt.store.connection():
        job_ids = create_batched(rt, 2, job_type='synthetic_batched')
        rt.start_background()
        jobs = all_terminal(job_ids)

        assert {job.lifecycle_status for job in jobs} == {'succeeded'}
        assert AiProviderBatchItem.select().count() == 0
        assert batch_fake.submitted_custom_ids == []
        assert {row.batch_id for row in usage_rows(job_ids)} == {None}


def one_job_a_batch(make_batch_rt, batch_fake):
    """A runtime whose batches take one job and are polled at once, the fake in manual mode,
    and an engine to run the job by hand."""
    rt = make_batch_rt(batched_definition(max_jobs=1), AIJOB_BATCH_POLL_FIRST_MS='1')
    batch_fake.mode = 'manual'
    return rt, ExecutionEngine(rt, 'test-worker')


def park_one_submitted(rt, engine):
    """One job parked and its batch submitted: (job id, the batch row)."""
    [job_id] = create_batched(rt, 1)
    assert engine.execute(job_id) == 'deferred'
    rt.features['batches'].step()
    batch = AiProviderBatch.get()
    assert batch.state == 'submitted'
    return job_id, batch


def wake_now(rt, job_id):
    """The job's wake time passes (as when its deferral's own wake-up comes)."""
    AiJob.update(lock_until=rt.store.now_plus_ms(-1000)).where(AiJob.id == job_id).execute()


def test_a_job_woken_before_its_line_parks_again_and_its_line_still_wakes_it(
    make_batch_rt, batch_fake
):
    rt, engine = one_job_a_batch(make_batch_rt, batch_fake)
    with rt.store.connection():
        job_id, batch = park_one_submitted(rt, engine)
        wake_now(rt, job_id)
        assert engine.execute(job_id) == 'deferred'  # woken too early: parked again
        item = AiProviderBatchItem.get(AiProviderBatchItem.job_id == job_id)
        assert (item.state, item.parked_attempt) == ('batched', 2)

        batch_fake.set_status(batch.provider_batch_id, 'completed')
        rt.features['batches'].step()
        job = AiJob.get_by_id(job_id)
        assert job.lock_until <= rt.store.clock()  # its wake time is now
        assert engine.execute(job_id) == 'succeeded'
        assert [(row.cost, row.batch_id) for row in usage_rows([job_id])] == [
            (BATCH_COST, batch.id)
        ]
        assert batch_fake.submitted_custom_ids == ['%s:1' % job_id]


@pytest.mark.slow
def test_a_batch_that_failed_at_the_provider_sends_its_jobs_online(make_batch_rt, batch_fake):
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        job_ids, batch = running_in_a_submitted_batch(rt, 2)
        batch_fake.set_status(batch.provider_batch_id, 'failed')
        jobs = all_terminal(job_ids)

        assert {job.lifecycle_status for job in jobs} == {'succeeded'}
        assert [(row.cost, row.batch_id) for row in usage_rows(job_ids)] == [
            (ONLINE_COST, None)
        ] * 2
        assert len(batch_fake.requests) == 2
        assert AiProviderBatch.get_by_id(batch.id).provider_status == 'failed'


def test_a_job_parked_longer_than_its_deferral_goes_online_and_its_late_line_is_ignored(
    make_batch_rt, batch_fake
):
    rt, engine = one_job_a_batch(make_batch_rt, batch_fake)
    with rt.store.connection():
        job_id, batch = park_one_submitted(rt, engine)
        # 26 h later the provider still has not ended the batch: the park's own wake-up comes
        long_ago = rt.store.clock() - datetime.timedelta(hours=26)
        AiProviderBatchItem.update(created_at=long_ago).execute()
        wake_now(rt, job_id)

        assert engine.execute(job_id) == 'succeeded'  # online
        assert len(batch_fake.requests) == 1
        [row] = usage_rows([job_id])
        assert (row.cost, row.batch_id) == (ONLINE_COST, None)

        batch_fake.set_status(batch.provider_batch_id, 'completed')  # the line comes after all
        rt.features['batches'].step()
        assert AiProviderBatchItem.get().state == 'consumed'
        assert len(events_of(job_id, SUCCEEDED)) == 1 and len(usage_rows([job_id])) == 1


def test_a_job_woken_on_another_entry_of_its_route_uses_its_answered_line(
    make_batch_rt, batch_fake
):
    rt = make_batch_rt(batched_definition(max_jobs=1), AIJOB_BATCH_POLL_FIRST_MS='1')
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        [job_id] = create_batched(rt, 1)
        assert engine.execute(job_id) == 'deferred'
        rt.features['batches'].step()
        wait_until(
            lambda: rt.features['batches'].step() or AiProviderBatchItem.get().state == 'answered'
        )
        # the definition no longer batches (as on an entry without a policy): the answer the
        # provider billed is used all the same, not bought again online
        online = dataclasses.replace(rt.registry.get('batched'), batch=None)
        rt.registry._definitions['batched'] = online  # a redeploy without the policy
        assert engine.execute(job_id) == 'succeeded'
        assert batch_fake.requests == []
        [row] = usage_rows([job_id])
        assert row.cost == BATCH_COST and row.batch_id == AiProviderBatch.get().id
