"""Webhooks end to end (architecture decision 15): real HTTP receivers on 127.0.0.1 (allowed by
AIJOB_WEBHOOK_ALLOW_HTTP and AIJOB_WEBHOOK_ALLOW_PRIVATE) get exactly one signed delivery per
terminal job, checked with the README's own receiver; retries keep the ``webhook-id``; a receiver
that never answers holds up no job; a worker killed mid-delivery leaves it to be sent again; and
the URL rule refuses loopback, link-local and private targets, at registration and at delivery.
(The terminal events themselves, and the rolled-back attempts that leave none, are in
tests/kernel/dispatch/test_terminal_events.py.)"""

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest

from engine.core.models import AiJob, OutboxEvent
from engine.extensions import INSTALLED
from engine.features.webhooks import urls as webhook_urls
from engine.features.webhooks.models import WebhookDelivery, WebhookEndpoint
from engine.runtime import Runtime
from tests.kernel.execution.test_recovery import WorkerProcess
from tests.support.api import JOBS, Harness, job_body
from tests.support.backends import REDIS_URL, delete_redis_keys, require_servers, reset_tables
from tests.support.helpers import wait_until
from tests.support.paths import ROOT
from tests.support.runtimes import FAST_SETTINGS, MASTER_KEY, fast_registry, wait_terminal
from tests.support.servers import free_port

HOOKS = '/api/ai/webhooks'
DELIVERIES = '/admin-api/ai/webhook-deliveries'
# Local receivers, fast retries (50 ms, 250 ms, …), a short timeout.
PUSH_SETTINGS = {
    'AIJOB_CREDENTIAL_MASTER_KEY': MASTER_KEY,
    'AIJOB_WEBHOOK_ALLOW_HTTP': '1',
    'AIJOB_WEBHOOK_ALLOW_PRIVATE': '1',
    'AIJOB_WEBHOOK_RETRY_BASE_MS': '50',
    'AIJOB_WEBHOOK_TIMEOUT_MS': '1000',
}


@pytest.fixture
def make_push_api(make_runtime):
    """``make_push_api(**settings)``: the API over a fast runtime with PUSH_SETTINGS (updated by
    ``settings``); ``start=True`` runs its dispatcher, workers and webhook loop in this process."""
    with contextlib.ExitStack() as stack:

        def make(start=True, **settings):
            runtime = make_runtime(
                registry=fast_registry(), **{**FAST_SETTINGS, **PUSH_SETTINGS, **settings}
            )
            stack.enter_context(runtime.store.connection())
            harness = Harness(runtime)
            if start:
                runtime.start_background()
                stack.callback(runtime.stop_background, timeout_s=5)
            return harness

        yield make


@pytest.fixture
def push_api(make_push_api):
    return make_push_api()


def register(api, url, client=None, **fields):
    response = (client or api.a).post(HOOKS, {'url': url, **fields})
    assert response.status == 201, response
    return response.json


def deliveries(api, **query):
    response = api.admin.get(DELIVERIES, query=query)
    assert response.status == 200, response
    return response.json['items']


def wait_delivered(api, count, timeout=20.0):
    return wait_until(
        lambda: (lambda items: items if len(items) >= count else None)(
            deliveries(api, status='delivered')
        ),
        timeout=timeout,
    )


# ---------------------------------------------------------------- the README's receiver
def readme_receiver_source():
    """The receiver the README shows under "Verifying a delivery" (a python block)."""
    readme = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    section = readme.split('### Verifying a delivery', 1)[1]
    return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def readme_verify():
    """The README's ``verify(headers, body, secret)``, without starting its server."""
    source = readme_receiver_source().split('\nclass ', 1)[0]
    namespace = {}
    exec(compile(source, 'README.md', 'exec'), namespace)  # noqa: S102 - our own README
    return namespace['verify']


def test_the_readme_verification_is_under_ten_lines():
    source = readme_receiver_source()
    verify = source[source.index('def verify') : source.index('\nclass ')].strip().splitlines()
    assert len(verify) <= 10, verify


@pytest.mark.slow
def test_one_signed_delivery_per_terminal_job_verified_by_the_readme_receiver(
    make_push_api, tmp_path
):
    """The README's receiver, run as a process of its own, accepts the deliveries of a
    succeeded, a failed and a cancelled job (and nothing else), each exactly once, each body the
    job's status as GET /api/ai/jobs/{id} shows it."""
    api = make_push_api(start=False)  # no workers yet: the third job is cancelled while queued
    port = free_port()
    url = 'http://127.0.0.1:%d/aijob' % port
    endpoint = register(api, url)
    assert endpoint['secret'].startswith('whsec_')
    assert 'secret' not in api.a.get(HOOKS).json['items'][0]  # shown once
    script = tmp_path / 'receiver.py'
    script.write_text(readme_receiver_source())
    out = open(tmp_path / 'receiver.out', 'w+')
    env = dict(os.environ, AIJOB_WEBHOOK_SECRET=endpoint['secret'], PORT=str(port))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=out, stderr=out)
    try:
        wait_until(lambda: _answers(url), timeout=10)
        cancelled = api.create(targetId='c')
        assert api.a.post(JOBS + '/' + cancelled + '/cancel').status in (200, 202)
        succeeded = api.create(targetId='s', input={'output': {'v': 1}})
        failed = api.create(targetId='f', input={'failWith': 'PROVIDER_ERROR', 'failTimes': 9})
        api.runtime.start_background()
        try:
            for job_id in (succeeded, failed, cancelled):
                wait_terminal(api.runtime, job_id)
            items = wait_delivered(api, 3)
            time.sleep(0.5)  # a second delivery of any of them would arrive now
        finally:
            api.runtime.stop_background(timeout_s=5)
    finally:
        proc.terminate()
        proc.wait(10)
    out.seek(0)
    printed = sorted(line.split() for line in out.read().splitlines() if line.startswith('job'))
    assert printed == sorted(
        [
            ['job', succeeded, 'succeeded', items_id(items, succeeded)],
            ['job', failed, 'failed', items_id(items, failed)],
            ['job', cancelled, 'cancelled', items_id(items, cancelled)],
        ]
    )
    assert len(deliveries(api)) == 3
    for item in items:
        assert (item['attemptCount'], item['lastStatusCode']) == (1, 204)
        assert (
            item['eventType']
            == 'ai.job.' + api.a.get(JOBS + '/' + item['jobId']).json['lifecycleStatus']
        )


def items_id(items, job_id):
    return next(item['deliveryId'] for item in items if item['jobId'] == job_id)


def _answers(url):
    """Is the receiver up? (It answers a forged signature 401.)"""
    headers = {
        'webhook-id': 'probe',
        'webhook-timestamp': str(int(time.time())),
        'webhook-signature': 'v1,Zm9yZ2Vk',
    }
    try:
        urllib.request.urlopen(urllib.request.Request(url, b'{}', headers), timeout=1)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except OSError:
        return False
    return False


def test_the_body_is_the_job_status_and_a_forged_signature_fails(push_api, receiver):
    secret = register(push_api, receiver.url)['secret']
    job_id = push_api.create(input={'output': {'answer': 42}})
    headers, body = receiver.wait_for(1)[0]
    verify = readme_verify()
    assert verify(headers, body, secret)
    assert headers['webhook-id'] == deliveries(push_api)[0]['deliveryId']
    assert headers['content-type'] == 'application/json'
    status = push_api.a.get(JOBS + '/' + job_id).json
    assert json.loads(body) == status
    assert not verify(headers, body + b' ', secret)  # a changed body
    assert not verify(headers, body, register(push_api, receiver.url)['secret'])  # another key
    stale = dict(headers, **{'webhook-timestamp': str(int(time.time()) - 600)})
    assert not verify(stale, body, secret)  # (and its signature no longer matches either)


@pytest.mark.slow
def test_a_receiver_that_answers_500_twice_gets_the_same_webhook_id_a_third_time(
    push_api, receiver
):
    secret = register(push_api, receiver.url)['secret']
    receiver.statuses = [500, 500]
    job_id = push_api.create()
    requests = receiver.wait_for(3)
    ids = {headers['webhook-id'] for headers, _ in requests}
    assert len(ids) == 1
    verify = readme_verify()
    assert all(verify(headers, body, secret) for headers, body in requests)
    (item,) = wait_delivered(push_api, 1)
    assert (item['deliveryId'], item['jobId']) == (ids.pop(), job_id)
    assert (item['attemptCount'], item['lastStatusCode'], item['lastError']) == (3, 200, None)
    time.sleep(0.3)
    assert len(receiver.requests) == 3


def test_a_delivery_that_keeps_failing_is_dead_then_redelivered_by_an_admin(
    make_push_api, receiver
):
    api = make_push_api(AIJOB_WEBHOOK_MAX_ATTEMPTS='2')
    register(api, receiver.url)
    receiver.statuses = [503, 503]
    api.create()
    wait_until(lambda: deliveries(api, status='dead'))
    (dead,) = deliveries(api, status='dead')
    assert (dead['attemptCount'], dead['lastStatusCode'], dead['lastError']) == (2, 503, 'HTTP 503')
    response = api.admin.post(DELIVERIES + '/' + dead['deliveryId'] + '/redeliver')
    assert response.status == 200, response
    (item,) = wait_delivered(api, 1)
    assert (item['deliveryId'], item['attemptCount']) == (dead['deliveryId'], 1)
    assert [h['webhook-id'] for h, _ in receiver.wait_for(3)] == [dead['deliveryId']] * 3
    user = api.a.post(DELIVERIES + '/' + dead['deliveryId'] + '/redeliver')
    assert (user.status, user.error_code) == (403, 'FORBIDDEN')  # an admin route
    missing = api.admin.post(DELIVERIES + '/nope/redeliver')
    assert (missing.status, missing.error_code) == (404, 'WEBHOOK_DELIVERY_NOT_FOUND')


@pytest.mark.slow
def test_endpoints_filter_by_event_and_job_type_and_a_job_may_carry_its_own_url(
    push_api, make_receiver
):
    every, failures_only, own = make_receiver(), make_receiver(), make_receiver()
    register(push_api, every.url)
    register(push_api, failures_only.url, events=['ai.job.failed'])
    register(push_api, every.url, jobTypes=['synthetic_bg'])  # never this job type
    register(push_api, every.url, client=push_api.b)  # user b's: never user a's jobs
    job_id = push_api.create(webhookUrl=own.url)
    wait_delivered(push_api, 2)
    assert [h['webhook-id'] for h, _ in every.wait_for(1)] != []
    time.sleep(0.5)
    assert (len(every.requests), len(failures_only.requests), len(own.requests)) == (1, 0, 1)
    own_headers, own_body = own.requests[0]
    job_secret = push_api.a.get(HOOKS + '/job-secret').json['secret']
    assert readme_verify()(own_headers, own_body, job_secret)
    assert {item['jobId'] for item in deliveries(push_api)} == {job_id}


@pytest.mark.slow
def test_a_receiver_that_never_answers_does_not_slow_jobs(make_push_api, make_receiver):
    """20 jobs with every endpoint hanging (each attempt holds a sending thread for the whole
    timeout) against 20 jobs with no endpoint: the jobs all finish while no delivery has been
    answered. Prints both durations (medians of 3 rounds)."""
    api = make_push_api(AIJOB_WEBHOOK_TIMEOUT_MS='30000')
    hanging = make_receiver()
    hanging.hold.clear()  # never answers while the test runs

    def twenty_jobs(round_no):
        started = time.monotonic()
        ids = [
            api.create(targetId='r%d-%d' % (round_no, i), input={'sleepMs': 20}) for i in range(20)
        ]
        for job_id in ids:
            assert wait_terminal(api.runtime, job_id).lifecycle_status == 'succeeded'
        return time.monotonic() - started

    without = [twenty_jobs(i) for i in range(3)]
    register(api, hanging.url)
    register(api, hanging.url)  # two deliveries per job: the sending threads fill up at once
    with_hanging = [twenty_jobs(3 + i) for i in range(3)]
    assert hanging.requests and not deliveries(api, status='delivered')
    assert len(deliveries(api, status='sending')) == api.runtime.config.webhook_concurrency
    print(
        '\n20 jobs: %.3fs without webhooks, %.3fs with a receiver that never answers '
        '(ratio %.2f; medians of 3)'
        % (
            statistics.median(without),
            statistics.median(with_hanging),
            statistics.median(with_hanging) / statistics.median(without),
        )
    )


# ---------------------------------------------------------------- a worker killed mid-send
@pytest.fixture
def shared_push(backend, make_runtime):
    """A runtime whose queue is Redis (worker processes share it), with PUSH_SETTINGS."""
    require_servers('redis')
    settings = {**FAST_SETTINGS, **PUSH_SETTINGS, 'AIJOB_REDIS_URL': REDIS_URL}
    rt = make_runtime(**settings)
    rt.env = backend.env(**settings)
    with rt.store.connection():
        yield Harness(rt)
    delete_redis_keys(backend.prefix)


@pytest.mark.slow
def test_a_worker_killed_during_a_delivery_leaves_it_to_be_sent_again(shared_push, receiver):
    api = shared_push
    secret = register(api, receiver.url)['secret']
    receiver.hold.clear()  # the first attempt hangs: the worker is killed while it waits
    first = WorkerProcess(api.runtime.env)
    try:
        job_id = api.create()
        ((headers, body),) = receiver.wait_for(1)
        first.kill()  # SIGKILL
        first.wait(10)
        (sending,) = deliveries(api)
        assert (sending['status'], sending['attemptCount']) == ('sending', 0)
        receiver.hold.set()  # later attempts are answered at once
        second = WorkerProcess(api.runtime.env)
        try:
            (item,) = wait_delivered(api, 1)  # once the dead worker's claim has expired
        finally:
            second.close()
    finally:
        first.close()
    again_headers, again_body = receiver.requests[1]
    assert again_headers['webhook-id'] == headers['webhook-id'] == item['deliveryId']
    assert again_body == body
    assert readme_verify()(again_headers, again_body, secret)
    assert (item['jobId'], item['attemptCount'], item['status']) == (job_id, 1, 'delivered')
    assert len(receiver.requests) == 2


# ---------------------------------------------------------------- the URL rule
@pytest.fixture
def fake_dns(monkeypatch):
    """Names resolved the way a test says (the one step tests replace in webhook_urls)."""
    names = {}
    real = webhook_urls.resolve

    def resolve(host, port):
        return list(names[host]) if host in names else real(host, port)

    monkeypatch.setattr(webhook_urls, 'resolve', resolve)
    return names


@pytest.mark.parametrize(
    'url',
    [
        'http://127.0.0.1/hook',
        'https://127.0.0.1/hook',
        'http://169.254.169.254/latest/meta-data/',
        'https://[::1]/hook',
        'https://10.1.2.3/hook',
        'https://localhost/hook',
        'https://internal.example/hook',  # resolves to a private address (fake_dns)
        'https://split.example/hook',  # one public and one private address
        'ftp://hooks.example/hook',
        'https://user:pw@hooks.example/hook',
    ],
)
def test_the_url_rule_refuses_by_default(make_push_api, fake_dns, url):
    fake_dns.update(
        {
            'internal.example': ['192.168.1.20'],
            'split.example': ['93.184.216.34', '10.0.0.7'],
            'hooks.example': ['93.184.216.34'],
        }
    )
    api = make_push_api(start=False, AIJOB_WEBHOOK_ALLOW_HTTP='0', AIJOB_WEBHOOK_ALLOW_PRIVATE='0')
    response = api.a.post(HOOKS, {'url': url})
    assert (response.status, response.error_code) == (400, 'WEBHOOK_URL_REFUSED'), response
    assert api.a.post(JOBS, job_body(webhookUrl=url)).error_code == 'WEBHOOK_URL_REFUSED'
    assert api.a.get(HOOKS).json['items'] == []
    assert AiJob.select().count() == 0  # a refused create changes nothing


def test_plain_http_is_refused_unless_allowed_and_a_public_https_url_is_accepted(
    make_push_api, fake_dns
):
    fake_dns['hooks.example'] = ['93.184.216.34']
    api = make_push_api(start=False, AIJOB_WEBHOOK_ALLOW_HTTP='0', AIJOB_WEBHOOK_ALLOW_PRIVATE='0')
    assert api.a.post(HOOKS, {'url': 'http://hooks.example/x'}).error_code == 'WEBHOOK_URL_REFUSED'
    assert api.a.post(HOOKS, {'url': 'https://hooks.example/x'}).status == 201
    with_http = make_push_api(start=False, AIJOB_WEBHOOK_ALLOW_PRIVATE='0')
    assert with_http.a.post(HOOKS, {'url': 'http://hooks.example/x'}).status == 201
    # Plain http allowed still is not private addresses allowed.
    assert with_http.a.post(HOOKS, {'url': 'http://127.0.0.1/x'}).error_code == (
        'WEBHOOK_URL_REFUSED'
    )


def test_a_name_that_resolves_elsewhere_at_delivery_time_is_refused_then(
    make_push_api, fake_dns, receiver
):
    """DNS rebinding: public when registered, the receiver's loopback address when sent."""
    fake_dns['rebind.example'] = ['93.184.216.34']
    api = make_push_api(AIJOB_WEBHOOK_ALLOW_PRIVATE='0', AIJOB_WEBHOOK_MAX_ATTEMPTS='2')
    port = receiver.server.server_address[1]
    register(api, 'http://rebind.example:%d/hook' % port)
    fake_dns['rebind.example'] = ['127.0.0.1']
    api.create()
    wait_until(lambda: deliveries(api, status='dead'))
    (dead,) = deliveries(api)
    assert dead['lastError'].startswith('WEBHOOK_URL_REFUSED')
    assert dead['lastStatusCode'] is None
    assert receiver.requests == []


@pytest.mark.slow
def test_a_redirect_is_not_followed(push_api, make_receiver):
    """Even where private targets are allowed, a 3xx is a failed attempt: the Location (here
    the metadata address, served by a second receiver) is never asked."""
    redirecting, target = make_receiver(), make_receiver()
    redirecting.statuses = [302]
    redirecting.redirect_to = target.url
    register(push_api, redirecting.url)
    push_api.create()
    (item,) = wait_delivered(push_api, 1)  # the retry is answered 200
    assert item['attemptCount'] == 2
    assert len(redirecting.requests) == 2 and target.requests == []


def test_endpoint_routes_keep_users_apart_and_refuse_bad_bodies(push_api):
    api = push_api
    mine = register(api, 'http://127.0.0.1:9/a', events=['ai.job.failed'])
    assert mine['events'] == ['ai.job.failed'] and mine['jobTypes'] is None
    assert [e['webhookId'] for e in api.a.get(HOOKS).json['items']] == [mine['webhookId']]
    assert api.b.get(HOOKS).json['items'] == []
    gone = api.b.request('DELETE', HOOKS + '/' + mine['webhookId'])
    assert (gone.status, gone.error_code) == (404, 'WEBHOOK_NOT_FOUND')
    for body, code in (
        ({'url': 'http://127.0.0.1:9/a', 'events': ['ai.job.created']}, 'INVALID_REQUEST'),
        ({'url': 'http://127.0.0.1:9/a', 'jobTypes': ['nope']}, 'INVALID_REQUEST'),
        ({'url': 'http://127.0.0.1:9/a', 'secret': 'x'}, 'INVALID_REQUEST'),
        ({}, 'WEBHOOK_URL_REFUSED'),
    ):
        response = api.a.post(HOOKS, body)
        assert (response.status, response.error_code) == (400, code), response
    assert api.a.request('DELETE', HOOKS + '/' + mine['webhookId']).status == 204
    assert api.a.get(HOOKS).json['items'] == []
    assert api.anon.get(HOOKS).status == 401
    assert api.a.get(DELIVERIES).status == 403
    assert WebhookDelivery.select().count() == 0


def test_without_a_master_key_webhooks_are_unavailable(make_push_api):
    api = make_push_api(start=False, AIJOB_CREDENTIAL_MASTER_KEY='')
    response = api.a.post(HOOKS, {'url': 'http://127.0.0.1:9/a'})
    assert (response.status, response.error_code) == (503, 'WEBHOOKS_UNAVAILABLE')
    response = api.a.post(JOBS, job_body(webhookUrl='http://127.0.0.1:9/a'))
    assert (response.status, response.error_code) == (503, 'WEBHOOKS_UNAVAILABLE')


# ---------------------------------------------------------------- the feature and the kernel
def test_a_job_s_webhook_url_is_part_of_its_idempotency_fingerprint(make_push_api):
    """The create body's webhookUrl (the feature's create field): a replay with the same URL
    is the same job, a different URL or none under the same key is refused, nothing written."""
    api = make_push_api(start=False)
    first = api.a.post(JOBS, job_body(key='k1', webhookUrl='http://127.0.0.1:9/a'))
    assert first.status == 201
    again = api.a.post(JOBS, job_body(key='k1', webhookUrl='http://127.0.0.1:9/a'))
    assert (again.status, again.json['jobId']) == (200, first.json['jobId'])
    for other in (job_body(key='k1', webhookUrl='http://127.0.0.1:9/b'), job_body(key='k1')):
        response = api.a.post(JOBS, other)
        assert (response.status, response.error_code) == (422, 'IDEMPOTENCY_KEY_REUSED')
    endpoints = api.runtime.features['webhooks'].repository
    assert WebhookEndpoint.select().where(WebhookEndpoint.job_id.is_null(False)).count() == 1
    assert endpoints.list_endpoints('user-a') == []  # a job's own URL is not a user endpoint


def test_without_the_feature_webhook_url_is_an_unknown_field_and_no_route_is_served(backend):
    """The engine with every installed extension but the webhooks (its line gone from
    engine/extensions.py): jobs run, the create body refuses webhookUrl, the document and
    the app know no webhook path, and the terminal events are marked published all the same."""
    extensions = tuple(e for e in INSTALLED if e.name != 'webhooks')
    runtime = Runtime(
        backend.config(**FAST_SETTINGS), registry=fast_registry(), extensions=extensions
    )
    try:
        runtime.create_schema()
        reset_tables(runtime)
        with runtime.store.connection():
            api = Harness(runtime)
            refused = api.a.post(JOBS, job_body(webhookUrl='https://hooks.example.com/x'))
            assert (refused.status, refused.error_code) == (400, 'INVALID_REQUEST')
            assert 'webhookUrl' not in json.dumps(api.app_document()['components']['schemas'])
            assert not [path for path in api.app_document()['paths'] if 'webhook' in path]
            assert api.a.get(HOOKS).status == 404
            job_id = api.create()
        runtime.start_background()
        with runtime.store.connection():
            assert wait_terminal(runtime, job_id).lifecycle_status == 'succeeded'
            wait_until(lambda: not OutboxEvent.select().where(OutboxEvent.status != 'published'))
    finally:
        runtime.close()
