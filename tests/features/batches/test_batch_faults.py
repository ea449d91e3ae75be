"""Provider batches when something goes wrong with one batch (issue 22, the review's defects), in
process on each backend pair against the fake batch API, the leader's step run by hand: a batch
whose provider left the configuration or whose step raises stays with its own row while the
others go on; a malformed result line costs its own item only; a cancelled job's billed line is
counted in the batch's cost, its usage and its budgets; abandoned batches are cancelled one by
one, and a batch whose jobs all ended is dropped before it is sent; a leader that lost its lease
sends nothing; and ``maxJobs`` is bounded by what one step can see."""

import json
from decimal import Decimal

import pytest

from engine.core.errors import InvalidDefinitionError
from engine.core.models import AiUsageLog
from engine.execution.engine import ExecutionEngine
from engine.features.batches.api import BatchApi
from engine.features.batches.batcher import FORM_SCAN
from engine.features.batches.models import AiProviderBatch, AiProviderBatchItem
from engine.features.batches.poller import _batch_usage
from engine.features.budgets.models import AiBudgetSpend
from tests.support.batched_jobs import FAST_BATCHES, batched_definition, provider_settings
from tests.support.helpers import create_job
from tests.support.runtimes import FAST_SETTINGS, fast_registry

BATCH_COST = Decimal('0.012500')  # the fake's line usage at half of PRICE
ONLINE_COST = Decimal('0.025000')


@pytest.fixture
def batch_rt(make_runtime, batch_fake):
    """A runtime whose one provider is the fake, every batch of ``max_jobs`` jobs due at once
    and every poll due at the next step; nothing runs in the background."""

    def make(max_jobs=1, price=None):
        registry = fast_registry(batched_definition(max_wait_ms=1, max_jobs=max_jobs))
        settings = {
            **FAST_SETTINGS,
            **FAST_BATCHES,
            'AIJOB_BATCH_POLL_FIRST_MS': '1',
            'AIJOB_BATCH_POLL_MAX_MS': '1',
        }
        settings = provider_settings(batch_fake.base_url, **settings)
        if price is not None:
            raw = json.loads(settings['AIJOB_PROVIDERS'])
            raw['providers']['fake']['models']['fake-model']['price'] = price
            settings['AIJOB_PROVIDERS'] = json.dumps(raw)
        return make_runtime(registry=registry, **settings)

    return make


def parked(rt, engine, count):
    job_ids = [create_job(rt, job_type='batched', input={}).id for _ in range(count)]
    assert [engine.execute(job_id) for job_id in job_ids] == ['deferred'] * count
    return job_ids


def batch_of(job_id):
    item = AiProviderBatchItem.get(AiProviderBatchItem.job_id == job_id)
    return AiProviderBatch.get_by_id(item.batch_id)


def item_of(job_id):
    return AiProviderBatchItem.get(AiProviderBatchItem.job_id == job_id)


def test_a_batch_whose_provider_left_the_configuration_ends_and_its_job_goes_online(
    batch_rt, batch_fake
):
    rt = batch_rt()
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        orphan, kept = parked(rt, engine, 2)
        rt.features['batches'].batcher.form()
        AiProviderBatch.update(provider='removed').where(
            AiProviderBatch.id == batch_of(orphan).id
        ).execute()

        rt.features['batches'].step()

        assert batch_of(orphan).state == 'ended'
        assert item_of(orphan).state == 'expired'
        assert batch_of(kept).state == 'submitted'  # the broken row held nothing up
        assert len(batch_fake.batches) == 1
        assert engine.execute(orphan) == 'succeeded'  # woken; its call went online
        assert [(r.cost, r.batch_id) for r in AiUsageLog.select()] == [(ONLINE_COST, None)]


def test_a_batch_whose_step_raises_waits_its_backoff_and_the_others_go_on(
    batch_rt, batch_fake, monkeypatch, caplog
):
    rt = batch_rt()
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        broken, kept = parked(rt, engine, 2)
        rt.features['batches'].step()
        broken_id = batch_of(broken).id
        results = rt.features['batches'].poller.results

        def results_failing_for_one(batch, info):
            if batch.id == broken_id:
                raise AttributeError('a bug')
            results(batch, info)

        monkeypatch.setattr(rt.features['batches'].poller, 'results', results_failing_for_one)
        before = AiProviderBatch.get_by_id(broken_id)
        rt.features['batches'].step()  # retrieve -> completed in auto mode, over successive steps
        rt.features['batches'].step()
        rt.features['batches'].step()

        assert batch_of(kept).state == 'ended'
        assert item_of(kept).state == 'answered'
        after = AiProviderBatch.get_by_id(broken_id)
        assert after.state == 'submitted' and after.poll_count > before.poll_count
        assert after.next_poll_at > before.next_poll_at
        failed = [r for r in caplog.records if r.getMessage() == 'batch.step_failed']
        assert failed and {r.fields['batch_id'] for r in failed} == {broken_id}
        assert {r.fields['error'] for r in failed} == {'AttributeError'}

        monkeypatch.undo()
        AiProviderBatch.update(next_poll_at=rt.store.now()).where(
            AiProviderBatch.id == broken_id
        ).execute()
        rt.features['batches'].step()
        assert batch_of(broken).state == 'ended'


def test_a_malformed_line_costs_its_own_item_only(batch_rt, batch_fake):
    rt = batch_rt(max_jobs=3)
    engine = ExecutionEngine(rt, 'test-worker')
    batch_fake.mode = 'manual'
    with rt.store.connection():
        good, not_json, bad_body = parked(rt, engine, 3)
        rt.features['batches'].step()
        batch = batch_of(good)
        batch_fake.set_status(batch.provider_batch_id, 'completed')
        output_id = batch_fake.batches[batch.provider_batch_id]['output_file_id']
        lines = batch_fake.lines_of(output_id)
        by_job = {line['custom_id'].split(':')[0]: line for line in lines}
        by_job[bad_body]['response']['body'] = 'not an object'
        text = '\n'.join(
            ['{"custom_id": "%s:1", "response": ' % not_json, json.dumps(by_job[good])]
            + [json.dumps(by_job[bad_body]), '[1, 2]']
        )
        batch_fake.files[output_id]['content'] = (text + '\n').encode()

        rt.features['batches'].step()

        assert batch_of(good).state == 'ended'
        assert item_of(good).state == 'answered'
        assert (item_of(not_json).state, item_of(not_json).error_code) == ('failed', 'missing_line')
        assert (item_of(bad_body).state, item_of(bad_body).error_code) == (
            'failed',
            'malformed_line',
        )
        assert engine.execute(good) == 'succeeded'
        # Its job's retry policy decides: the retry parks its second call for the next batch.
        assert engine.execute(not_json) == 'deferred'
        retry = AiProviderBatchItem.get(AiProviderBatchItem.custom_id == '%s:2' % not_json)
        assert retry.state == 'waiting'


def test_a_cancelled_jobs_billed_line_counts_in_the_batch_cost_usage_and_budget(
    batch_rt, batch_fake
):
    rt = batch_rt(max_jobs=2)
    engine = ExecutionEngine(rt, 'test-worker')
    batch_fake.mode = 'manual'
    with rt.store.connection():
        rt.features['budgets'].put('global', '', 'total', Decimal('1000'), 'fail')
        kept, cancelled = parked(rt, engine, 2)
        rt.features['batches'].step()
        batch = batch_of(kept)
        assert rt.service.cancel_job(cancelled).lifecycle_status == 'cancelled'
        batch_fake.set_status(batch.provider_batch_id, 'completed')

        rt.features['batches'].step()

        [spend] = list(AiBudgetSpend.select())
        assert spend.spent_micros == 12_500  # the cancelled job's line, at the batch price
        [row] = list(AiUsageLog.select())
        assert (row.job_id, row.error_code, row.cost, row.batch_id) == (
            cancelled,
            'CANCELLED',
            BATCH_COST,
            batch.id,
        )
        ended = AiProviderBatch.get_by_id(batch.id)
        assert (ended.state, ended.cost) == ('ended', 2 * BATCH_COST)
        assert item_of(cancelled).state == 'cancelled'

        assert engine.execute(kept) == 'succeeded'
        [spend] = list(AiBudgetSpend.select())
        assert spend.spent_micros == 25_000
        assert AiUsageLog.select().count() == 2
        rt.features['batches'].step()  # run again: nothing counted twice
        assert AiUsageLog.select().count() == 2


def test_abandoned_batches_are_cancelled_one_by_one(batch_rt, batch_fake):
    rt = batch_rt()
    engine = ExecutionEngine(rt, 'test-worker')
    batch_fake.mode = 'manual'
    with rt.store.connection():
        first, second, alive = parked(rt, engine, 3)
        rt.features['batches'].step()
        assert {batch_of(j).state for j in (first, second, alive)} == {'submitted'}
        for job_id in (first, second):
            rt.service.cancel_job(job_id)
        batch_fake.refuse(400, times=1)  # the first cancel is refused for good

        rt.features['batches'].step()

        assert batch_fake.cancelled_batch_ids == [batch_of(second).provider_batch_id]
        assert batch_of(first).state == 'ended'  # abandoned: its items leave the batch
        assert batch_of(second).state in ('cancelling', 'ended')
        assert batch_of(alive).state == 'submitted'


def test_a_batch_whose_jobs_all_ended_before_it_was_sent_is_dropped(batch_rt, batch_fake):
    rt = batch_rt(max_jobs=2)
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        job_ids = parked(rt, engine, 2)
        rt.features['batches'].batcher.form()
        for job_id in job_ids:
            rt.service.cancel_job(job_id)

        rt.features['batches'].step()

        batch = batch_of(job_ids[0])
        assert (batch.state, batch.input_file_id, batch.provider_batch_id) == ('ended', None, None)
        assert batch_fake.uploads == [] and batch_fake.batches == {}
        assert {item_of(j).state for j in job_ids} == {'cancelled'}


def test_a_leader_that_lost_its_lease_during_a_search_neither_uploads_nor_creates(
    batch_rt, batch_fake
):
    rt = batch_rt()
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        [job_id] = parked(rt, engine, 1)
        answers = iter([True, False])  # leading at the step's start; lost by the upload
        rt.features['batches'].step(leading=lambda: next(answers))
        assert (batch_of(job_id).state, batch_fake.uploads) == ('building', [])

        batch_fake.on('create_batch', lambda obj: (_ for _ in ()).throw(RuntimeError('cut')))
        rt.features['batches'].step()  # uploaded; the create's answer never arrives
        batch_fake.on('create_batch', None)
        assert batch_of(job_id).state == 'uploaded' and len(batch_fake.batches) == 1
        batch_fake.batches.clear()  # as if the create had never reached the provider
        AiProviderBatch.update(next_poll_at=None).execute()
        answers = iter([True, False])
        rt.features['batches'].step(leading=lambda: next(answers))
        assert batch_of(job_id).state == 'uploaded' and batch_fake.batches == {}

        rt.features['batches'].step()
        assert batch_of(job_id).state == 'submitted' and len(batch_fake.batches) == 1


def test_max_jobs_is_bounded_by_the_items_one_step_looks_at(batch_rt, batch_fake):
    rt = batch_rt(max_jobs=FORM_SCAN)  # the largest accepted
    engine = ExecutionEngine(rt, 'test-worker')
    with rt.store.connection():
        [job_id] = parked(rt, engine, 1)
        # Due by its wait (1 ms), far from its count. SQLite's clock counts whole milliseconds,
        # so a step in the park's own millisecond would see it waited 0 ms: it waited a second.
        AiProviderBatchItem.update(created_at=rt.store.now_plus_ms(-1000)).execute()
        rt.features['batches'].step()
        assert (batch_of(job_id).state, batch_of(job_id).job_count) == ('submitted', 1)
    with pytest.raises(InvalidDefinitionError, match='batch.maxJobs 5001 must be 1..5000'):
        batch_rt(max_jobs=FORM_SCAN + 1)


def test_a_batch_cost_reads_cached_tokens_as_the_online_path_does(batch_rt, batch_fake):
    """DeepSeek-style ``prompt_cache_hit_tokens``: 10 of the 11 prompt tokens at the cached
    price 0, so the line costs (1 x 1 + 7 x 2) / 1000, halved."""
    price = {'prompt': '1', 'completion': '2', 'cachedPrompt': '0', 'per': 1000}
    rt = batch_rt(price=price)
    engine = ExecutionEngine(rt, 'test-worker')
    batch_fake.line_usage = {'prompt_tokens': 11, 'completion_tokens': 7}
    batch_fake.line_usage['prompt_cache_hit_tokens'] = 10
    with rt.store.connection():
        [job_id] = parked(rt, engine, 1)
        for _ in range(5):  # validating, in_progress, finalizing, completed: then the results
            rt.features['batches'].step()
        assert batch_of(job_id).state == 'ended'
        assert batch_of(job_id).cost == Decimal('0.007500')
        assert _batch_usage({'usage': 'not an object'}).prompt_tokens == 0


def test_a_resume_stops_listing_at_entries_older_than_its_row(batch_rt, batch_fake, monkeypatch):
    """The provider lists newest first: a file or batch made long before the row was created
    cannot be the row's, so the search ends there instead of paging through the account."""
    rt = batch_rt()
    engine = ExecutionEngine(rt, 'test-worker')
    old = BatchApi(batch_fake.base_url, 'sk-test')
    for n in range(4):  # an account's earlier work, two hours old
        line = {'custom_id': 'x:%d' % n, 'method': 'POST', 'url': '/v1/chat/completions'}
        line['body'] = {'model': 'fake-model', 'messages': []}
        file_id = old.upload('other-%d.jsonl' % n, (json.dumps(line) + '\n').encode())
        created = old.create(file_id, 'other-%d' % n)
        batch_fake.batches[created['id']]['created_at'] -= 7200
    for file in batch_fake.files.values():
        file['object']['created_at'] -= 7200
    batch_fake.page_limit = 1
    pages = {'files': 0, 'batches': 0}
    for name, kind in (('list_files', 'files'), ('list_batches', 'batches')):

        def counted(query, listing=getattr(batch_fake, name), kind=kind):
            pages[kind] += 1
            return listing(query)

        monkeypatch.setattr(batch_fake, name, counted)
    with rt.store.connection():
        [job_id] = parked(rt, engine, 1)
        rt.features['batches'].step()

        assert batch_of(job_id).state == 'submitted'
        assert pages == {'files': 1, 'batches': 1}  # one page each, not four
