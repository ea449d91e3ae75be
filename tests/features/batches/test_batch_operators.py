"""Provider batches for operators (issue 22 item 5): ``GET /admin-api/ai/batches`` (checked
against /openapi.json by the test client), the dashboard's batches pages, and the ``/metrics``
gauges of open batches, jobs in batches and batch cost; on both backend pairs, with the batch rows
written directly through the models, as the batcher writes them."""

import datetime
import re
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.core.models import AiJob
from engine.features.batches.models import AiProviderBatch, AiProviderBatchItem
from engine.http.auth import TokenStore
from tests.features.batches.test_batches import (  # noqa: F401
    BATCH_COST,
    all_terminal,
    create_batched,
    make_batch_rt,
    submitted_batch,
)
from tests.features.dashboard.test_dashboard import fits_the_screen, served, submit  # noqa: F401
from tests.support.api import Harness
from tests.support.dashboard import FormClient
from tests.support.helpers import create_job, wait_until

BATCHES = '/admin-api/ai/batches'


def add_batch(rt, state='submitted', minutes_ago=0, cost='0', **columns):
    """One ai_provider_batch row, created ``minutes_ago`` before the database clock."""
    now = rt.store.clock()
    values = {
        'id': str(uuid.uuid4()),
        'provider': 'openai',
        'model': 'gpt-4o-mini',
        'state': state,
        'cost': cost,
        'created_at': now - datetime.timedelta(minutes=minutes_ago),
        'updated_at': now,
    }
    values.update(columns)
    AiProviderBatch.insert(**values).execute()
    return AiProviderBatch.get_by_id(values['id'])


def add_item(rt, job, state, batch=None, attempt_no=1, **columns):
    """One job attempt's ai_provider_batch_item row."""
    now = rt.store.clock()
    values = {
        'job_id': job.id,
        'attempt_no': attempt_no,
        'custom_id': '%s:%d' % (job.id, attempt_no),
        'group_key': 'openai/gpt-4o-mini',
        'batch_id': batch.id if batch else None,
        'state': state,
        'request': {'model': 'gpt-4o-mini', 'messages': []},
        'max_wait_ms': 60_000,
        'max_jobs': 50,
        'parked_attempt': job.attempt_no,
        'created_at': now,
        'updated_at': now,
    }
    values.update(columns)
    AiProviderBatchItem.insert(**values).execute()


@pytest.fixture
def api(engine_rt):
    return Harness(engine_rt)


def operator(api):
    client = FormClient(api.app)
    assert client.sign_in(api.tokens['admin']).status == 303
    return client


# ---------------------------------------------------------------- GET /admin-api/ai/batches
def test_the_admin_list_is_newest_first_in_keyset_pages(api):
    rt = api.runtime
    made = [add_batch(rt, minutes_ago=10 - n) for n in range(5)]  # made[4] is the newest

    first = api.admin.get(BATCHES, query={'limit': '2'})
    assert first.status == 200, first
    assert [b['batchId'] for b in first.json['items']] == [made[4].id, made[3].id]
    assert first.json['limit'] == 2
    seen = [b['batchId'] for b in first.json['items']]
    cursor = first.json['nextCursor']
    while cursor:
        page = api.admin.get(BATCHES, query={'limit': '2', 'cursor': cursor})
        seen += [b['batchId'] for b in page.json['items']]
        cursor = page.json['nextCursor']
    assert seen == [b.id for b in reversed(made)]


def test_the_admin_list_shows_what_the_batcher_stored(api):
    rt = api.runtime
    batch = add_batch(
        rt,
        state='ended',
        cost='0.012345',
        provider_status='completed',
        provider_batch_id='batch_abc',
        input_file_id='file-in',
        output_file_id='file-out',
        job_count=3,
        succeeded_count=2,
        failed_count=1,
        poll_count=4,
        submitted_at=rt.store.clock(),
        ended_at=rt.store.clock(),
    )

    [shown] = api.admin.get(BATCHES).json['items']

    assert shown['batchId'] == batch.id
    assert (shown['provider'], shown['model']) == ('openai', 'gpt-4o-mini')
    assert (shown['state'], shown['providerStatus']) == ('ended', 'completed')
    assert (shown['providerBatchId'], shown['inputFileId']) == ('batch_abc', 'file-in')
    assert (shown['outputFileId'], shown['errorFileId']) == ('file-out', None)
    assert (shown['jobCount'], shown['succeededCount'], shown['failedCount']) == (3, 2, 1)
    assert (shown['cost'], shown['pollCount']) == ('0.012345', 4)
    assert shown['endedAt'].endswith('Z') and shown['nextPollAt'] is None


def test_the_admin_list_filters_by_state(api):
    rt = api.runtime
    open_one = add_batch(rt, state='submitted')
    add_batch(rt, state='ended')

    page = api.admin.get(BATCHES, query={'state': 'submitted'})

    assert [b['batchId'] for b in page.json['items']] == [open_one.id]
    assert api.admin.get(BATCHES, query={'state': 'building'}).json['items'] == []


@pytest.mark.parametrize(
    'query, field',
    [
        ({'state': 'open'}, 'state'),
        ({'state': ''}, 'state'),
        ({'limit': '0'}, 'limit'),
        ({'limit': '101'}, 'limit'),
        ({'cursor': 'not a cursor'}, 'cursor'),
        ({'jobId': 'x'}, 'jobId'),
    ],
)
def test_a_bad_query_is_400_naming_the_parameter(api, query, field):
    refused = api.admin.get(BATCHES, query=query)

    assert refused.status == 400
    assert refused.json['error']['code'] == 'INVALID_REQUEST'
    assert refused.json['error']['field'] == field


def test_the_admin_list_is_for_admins_only(api):
    assert api.a.get(BATCHES).json['error']['code'] == 'FORBIDDEN'
    assert api.anon.get(BATCHES).json['error']['code'] == 'UNAUTHORIZED'


# ---------------------------------------------------------------- /metrics
def gauges(api):
    response = api.admin.get('/metrics')
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(response.body.decode('utf-8')):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_count_open_batches_jobs_in_batches_and_batch_cost(api):
    rt = api.runtime
    submitted = add_batch(rt, state='submitted')
    add_batch(rt, state='building')
    add_batch(rt, state='ended', cost='0.250000')
    add_batch(rt, state='ended', cost='0.125000')
    for _ in range(3):
        add_item(rt, create_job(rt), 'batched', submitted)
    add_item(rt, create_job(rt), 'waiting')
    add_item(rt, create_job(rt), 'consumed', submitted)

    samples = gauges(api)

    def gauge(name, **labels):
        return samples[(name, tuple(sorted(labels.items())))]

    assert gauge('aijob_provider_batches_open', state='submitted') == 1
    assert gauge('aijob_provider_batches_open', state='building') == 1
    assert gauge('aijob_provider_batches_open', state='uploaded') == 0
    assert gauge('aijob_provider_batches_open', state='cancelling') == 0
    assert ('aijob_provider_batches_open', (('state', 'ended'),)) not in samples
    assert gauge('aijob_provider_batch_jobs', state='batched') == 3
    assert gauge('aijob_provider_batch_jobs', state='waiting') == 1
    assert gauge('aijob_provider_batch_cost') == pytest.approx(0.375)


def test_metrics_without_batches_say_zero(api):
    samples = gauges(api)

    assert samples[('aijob_provider_batches_open', (('state', 'submitted'),))] == 0
    assert samples[('aijob_provider_batch_jobs', (('state', 'waiting'),))] == 0
    assert samples[('aijob_provider_batch_cost', ())] == 0


# ---------------------------------------------------------------- the dashboard
def test_the_batches_page_lists_batches_and_the_jobs_waiting_for_one(api):
    rt = api.runtime
    ended = add_batch(
        rt, state='ended', minutes_ago=90, cost='0.500000', job_count=2, succeeded_count=2
    )
    ended_at = ended.created_at + datetime.timedelta(minutes=2, seconds=5)
    AiProviderBatch.update(ended_at=ended_at).where(AiProviderBatch.id == ended.id).execute()
    open_one = add_batch(rt, state='submitted', provider_status='in_progress', job_count=50)
    add_item(rt, create_job(rt), 'waiting')
    add_item(rt, create_job(rt), 'waiting', group_key='novita/llama')
    client = operator(api)

    page = client.get('/dashboard/batches')

    assert page.status == 200
    rows = re.findall(r'<tr>\s*<td><a href="/dashboard/batches/([^"]+)">', page.text)
    assert rows == [open_one.id, ended.id]
    assert 'in_progress' in page.text and '0.500000' in page.text
    assert '2 min 5 s' in page.text  # an ended batch's age stops at its end
    assert re.search(r'<td>novita/llama</td><td>1</td>', page.text)
    assert re.search(r'<td>openai/gpt-4o-mini</td><td>1</td>', page.text)
    assert 'Batches</a>' in page.text  # in the navigation

    filtered = client.get('/dashboard/batches', {'state': 'ended'})
    assert ended.id in filtered.text and open_one.id not in filtered.text
    bad = client.get('/dashboard/batches', {'state': 'bogus'})
    assert bad.status == 200 and 'state must be one of' in bad.text


def test_the_batches_page_pages_by_keyset(api):
    rt = api.runtime
    made = [add_batch(rt, minutes_ago=30 - n) for n in range(25)]
    client = operator(api)

    first = client.get('/dashboard/batches')
    after = re.search(r'href="/dashboard/batches\?([^"]+)" rel="next"', first.text).group(1)
    second = client.get('/dashboard/batches?' + after.replace('&amp;', '&'))

    assert made[24].id in first.text and made[5].id in first.text
    assert made[4].id not in first.text
    assert made[4].id in second.text and made[0].id in second.text
    assert 'rel="next"' not in second.text


def test_a_batch_page_lists_its_jobs_linking_to_their_pages(api):
    rt = api.runtime
    batch = add_batch(rt, state='submitted', provider_batch_id='batch_xyz', job_count=2)
    answered, failed = create_job(rt), create_job(rt)
    add_item(rt, answered, 'answered', batch)
    add_item(rt, failed, 'failed', batch, error_code='PROVIDER_ERROR')
    add_item(rt, create_job(rt), 'batched', add_batch(rt))  # another batch's job
    client = operator(api)

    page = client.get('/dashboard/batches/' + batch.id)

    assert page.status == 200
    links = re.findall(r'<a href="/dashboard/jobs/([^"]+)">', page.text)
    assert links == [answered.id, failed.id]
    assert 'batch_xyz' in page.text and 'PROVIDER_ERROR' in page.text
    assert '<span class="badge s-queued">queued</span>' in page.text
    assert client.get('/dashboard/jobs/' + answered.id).status == 200


def test_an_unknown_batch_is_404_as_a_page_and_as_json(api):
    client = operator(api)

    page = client.get('/dashboard/batches/no-such-batch')
    assert page.status == 404 and 'BATCH_NOT_FOUND' in page.text
    as_json = client.get('/dashboard/batches/no-such-batch', accept='application/json')
    assert as_json.status == 404 and b'"BATCH_NOT_FOUND"' in as_json.body
    assert client.get('/dashboard/batches/%3Cscript%3E').status == 404


def test_the_batches_pages_are_for_signed_in_operators_only(api):
    add_batch(api.runtime)
    anonymous = FormClient(api.app)

    assert anonymous.get('/dashboard/batches').status == 303
    assert anonymous.get('/dashboard/batches', accept='application/json').status == 401
    user = FormClient(api.app)
    assert user.sign_in(TokenStore(api.runtime.store).create('user-z')).status == 403
    assert user.get('/dashboard/batches').status == 303


# ---------------------------------------------------------------- in a real browser
@pytest.mark.slow
def test_in_a_browser_an_operator_goes_from_the_batches_to_a_batch_and_its_job(
    chromium,
    served,  # noqa: F811
    make_runtime,
):
    base, admin, user = served
    job_id = submit(base, user)
    rt = make_runtime()  # the serve process's store (the first runtime reset it)
    with rt.store.connection():
        batch = add_batch(rt, state='ended', provider_status='completed', job_count=1)
        add_item(rt, AiJob.get_by_id(job_id), 'consumed', batch)
    context = chromium.new_context(viewport={'width': 1280, 'height': 900})
    page = context.new_page()
    errors = []
    page.on('console', lambda msg: errors.append(msg.text) if msg.type == 'error' else None)
    page.on('pageerror', lambda exc: errors.append(str(exc)))

    page.goto(base + '/dashboard')
    page.fill('#token', admin)
    page.click('button[type=submit]')
    page.click('nav >> text=Batches')
    assert page.url == base + '/dashboard/batches'
    page.click('a[href="/dashboard/batches/%s"]' % batch.id)
    assert page.locator('#state').inner_text() == 'ended'
    page.click('a[href="/dashboard/jobs/%s"]' % job_id)
    assert page.url == base + '/dashboard/jobs/' + job_id
    page.locator('#status').wait_for()

    phone = chromium.new_context(viewport={'width': 390, 'height': 844}, is_mobile=True)
    phone.add_cookies(context.cookies())
    small = phone.new_page()
    for path in ('/batches', '/batches/' + batch.id):
        small.goto(base + '/dashboard' + path)
        assert fits_the_screen(small), path
    phone.close()
    context.close()
    assert errors == []


# ---------------------------------------------------------------- batches the core made
@pytest.mark.slow
def test_operators_follow_a_real_batch_from_submitted_to_ended(make_batch_rt, batch_fake):  # noqa: F811
    batch_fake.mode = 'manual'
    rt = make_batch_rt()
    with rt.store.connection():
        api = Harness(rt)
        job_ids = create_batched(rt, 3)
        rt.start_background()
        wait_until(lambda: AiProviderBatch.select().where(AiProviderBatch.job_count == 3).first())
        batch = submitted_batch()

        # In flight: the list, the gauges and the batch's page show it.
        [shown] = api.admin.get(BATCHES, query={'state': 'submitted'}).json['items']
        assert (shown['batchId'], shown['jobCount']) == (batch.id, 3)
        assert shown['providerBatchId'] in batch_fake.batches
        samples = gauges(api)
        assert samples[('aijob_provider_batches_open', (('state', 'submitted'),))] == 1
        assert samples[('aijob_provider_batch_jobs', (('state', 'batched'),))] == 3
        client = operator(api)
        page = client.get('/dashboard/batches/' + batch.id)
        assert sorted(re.findall(r'<a href="/dashboard/jobs/([^"]+)">', page.text)) == sorted(
            job_ids
        )

        # Completed at the provider: every job succeeds, the batch ends with its cost.
        batch_fake.set_status(shown['providerBatchId'], 'completed')
        all_terminal(job_ids)
        ended = wait_until(
            lambda: api.admin.get(BATCHES, query={'state': 'ended'}).json['items'] or None
        )
        assert [(b['batchId'], b['succeededCount'], b['cost']) for b in ended] == [
            (batch.id, 3, str(BATCH_COST * 3))
        ]
        samples = gauges(api)
        assert samples[('aijob_provider_batches_open', (('state', 'submitted'),))] == 0
        assert samples[('aijob_provider_batch_jobs', (('state', 'batched'),))] == 0
        assert samples[('aijob_provider_batch_cost', ())] == pytest.approx(float(BATCH_COST * 3))
        page = client.get('/dashboard/batches/' + batch.id)
        assert page.text.count('<span class="badge s-succeeded">succeeded</span>') == 3
        assert str(BATCH_COST * 3) in client.get('/dashboard/batches').text
