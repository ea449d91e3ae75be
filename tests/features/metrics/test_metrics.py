"""Prometheus metrics (README "Metrics"): ``GET /metrics`` parsed with prometheus_client's own
parser; the counters move by exactly the jobs a test ran; HTTP metrics are labelled by route
template; the scrape-time gauges read the store and the queue; anonymous callers and users are
refused. Real processes: the ``worker``'s AIJOB_METRICS_PORT, and ``web`` with two gunicorn
workers whose counts every scrape sums (and whose metrics directory is gone after it stops)."""

import os
import subprocess
import sys
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.core.busiest_users import BUSIEST_USERS
from engine.core.signals import Signals
from engine.execution.engine import ExecutionEngine
from engine.extensions import INSTALLED
from engine.http.app import create_app
from engine.http.auth import TokenStore
from engine.runtime import Runtime
from tests.support.api import JOBS, Harness, poll_until, run_to_running
from tests.support.backends import require_servers
from tests.support.busy_users import EXPECTED, OLDEST_WAITING_S, craft, queued
from tests.support.helpers import create_job, wait_until
from tests.support.paths import ROOT
from tests.support.servers import free_port
from tests.support.wsgi import WsgiClient

SYNTHETIC = {'job_type': 'synthetic', 'queue': 'ai-interactive'}


def parse(text):
    """{(sample name, frozenset of label items): value} of one scrape."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(client):
    response = client.get('/metrics')
    assert response.status == 200, response
    assert response.headers['content-type'].startswith('text/plain')
    return parse(response.body.decode('utf-8'))


class Delta:
    """What moved between a scrape taken now and a later one."""

    def __init__(self, client):
        self.client = client
        self.before = scrape(client)

    def __call__(self, name, **labels):
        after = scrape(self.client)
        return value(after, name, **labels) - value(self.before, name, **labels)


@pytest.mark.slow
def test_counters_move_by_exactly_the_jobs_the_test_ran(live_api):
    delta = Delta(live_api.admin)
    bodies = [
        {'output': {'n': 1}},
        {'output': {'n': 2}},
        {'failWith': 'PROVIDER_TIMEOUT', 'failTimes': 1},  # one retry, then success
        {'failWith': 'CONTENT_SAFETY_BLOCKED'},  # not retryable: failed at once
    ]
    ids = [live_api.create(input=body) for body in bodies]
    for job_id in ids:
        poll_until(live_api.a, job_id, ('succeeded', 'failed'))

    finished = dict(SYNTHETIC, outcome='succeeded')
    # The terminal write commits before the worker counts it: wait for the last count.
    wait_until(lambda: delta('aijob_jobs_finished_total', **finished) == 3, timeout=5)
    assert delta('aijob_jobs_created_total', **SYNTHETIC) == 4
    assert delta('aijob_jobs_finished_total', **dict(SYNTHETIC, outcome='failed')) == 1
    assert delta('aijob_jobs_finished_total', **dict(SYNTHETIC, outcome='cancelled')) == 0
    assert delta('aijob_job_duration_seconds_count', **finished) == 3
    assert delta('aijob_job_queue_wait_seconds_count', **SYNTHETIC) == 4
    assert (
        delta('aijob_job_retries_total', job_type='synthetic', error_code='PROVIDER_TIMEOUT') == 1
    )
    provider = {'provider': 'synthetic', 'model': 'synthetic-1'}
    assert delta('aijob_provider_calls_total', result='ok', **provider) == 3
    assert delta('aijob_provider_calls_total', result='PROVIDER_TIMEOUT', **provider) == 1
    assert delta('aijob_provider_calls_total', result='CONTENT_SAFETY_BLOCKED', **provider) == 1
    assert delta('aijob_provider_call_duration_seconds_count', **provider) == 5
    assert delta('aijob_provider_tokens_total', kind='prompt', **provider) > 0
    # HTTP by route template, never by raw path: two artifact reads of two different jobs.
    for job_id in ids[:2]:
        assert live_api.a.get(JOBS + '/' + job_id + '/artifacts').status == 200
    route = {'method': 'GET', 'route': '/api/ai/jobs/<job_id>/artifacts'}
    assert delta('aijob_http_requests_total', status='200', **route) == 2
    assert delta('aijob_http_request_duration_seconds_count', **route) == 2
    assert delta('aijob_http_requests_total', method='POST', route=JOBS, status='201') == 4
    assert not any(job_id in str(key) for key in scrape(live_api.admin) for job_id in ids)


@pytest.mark.slow
def test_a_cancelled_queued_job_counts_as_finished_cancelled(api):
    delta = Delta(api.admin)
    job_id = api.create()
    assert api.a.post(JOBS + '/' + job_id + '/cancel').status == 200
    assert delta('aijob_jobs_finished_total', **dict(SYNTHETIC, outcome='cancelled')) == 1
    assert delta('aijob_jobs_created_total', **SYNTHETIC) == 1


def test_gauges_read_the_store_and_the_queue_at_scrape_time(api, backend):
    runtime = api.runtime
    ids = [api.create(targetId='n%d' % i) for i in range(2)]
    runtime.dispatcher.cycle()  # whatever was not pushed at once is pushed now
    run_to_running(runtime, ids[0], instance='worker-x')
    samples = scrape(api.admin)
    depth = sum(
        v
        for (name, labels), v in samples.items()
        if name == 'aijob_queue_depth' and ('queue', 'ai-interactive') in labels
    )
    assert depth == 2  # the lock above popped nothing
    assert value(samples, 'aijob_jobs_running', worker='worker-x') == 1
    assert value(samples, 'aijob_outbox_dead_events') == 0
    assert value(samples, 'aijob_outbox_oldest_pending_age_seconds') >= 0
    labels = [dict(labels) for (name, labels) in samples if name == 'aijob_queue_depth']
    assert {(d['queue'], d['shard']) for d in labels} == {
        ('ai-interactive', '0'),
        ('ai-background', '0'),
    }


def test_the_busiest_users_waiting_jobs_and_waits_exactly(api):
    """A crafted set of jobs (tests/support/busy_users.py): each busy user's jobs waiting and
    running and its wait quantiles, labelled by user id; a user with nothing started in the
    window has no quantile; a user with nothing waiting or running is not listed."""
    craft(api.runtime)
    samples = scrape(api.admin)
    users = {
        dict(labels)['user'] for (name, labels) in samples if name == 'aijob_user_jobs_waiting'
    }
    assert users == set(EXPECTED)
    for user, expected in EXPECTED.items():
        assert value(samples, 'aijob_user_jobs_waiting', user=user) == expected['waiting']
        assert value(samples, 'aijob_user_jobs_running', user=user) == expected['running']
        assert value(samples, 'aijob_user_queue_wait_jobs', user=user) == expected['waits']
        for quantile in ('0.5', '0.95'):
            key = (
                'aijob_user_queue_wait_seconds',
                frozenset({'user': user, 'quantile': quantile}.items()),
            )
            wanted = expected['p50' if quantile == '0.5' else 'p95']
            assert samples.get(key) == wanted, (user, quantile)
    oldest = value(samples, 'aijob_user_oldest_waiting_seconds', user='user-idle')
    assert OLDEST_WAITING_S['user-idle'] <= oldest < OLDEST_WAITING_S['user-idle'] + 30
    assert value(samples, 'aijob_user_oldest_waiting_seconds', user='user-light') == 0


def test_the_busiest_users_are_at_most_ten(api):
    now = api.runtime.store.clock()
    for n in range(12):
        queued(api.runtime, 'user-%02d' % n, 1, now)
    queued(api.runtime, 'user-11', 1, now)  # the busiest
    samples = scrape(api.admin)
    users = [
        dict(labels)['user'] for (name, labels) in samples if name == 'aijob_user_jobs_waiting'
    ]
    assert len(users) == BUSIEST_USERS == 10
    assert value(samples, 'aijob_user_jobs_waiting', user='user-11') == 2
    # ties by user id: user-00 … user-08 with the busiest; user-09 and user-10 left out
    assert sorted(users) == ['user-%02d' % n for n in range(9)] + ['user-11']


def test_metrics_refuse_anonymous_callers_and_users(make_runtime):
    runtime = make_runtime(AIJOB_METRICS_TOKEN='scrape-secret-123')
    with runtime.store.connection():
        api = Harness(runtime)
        anonymous = api.anon.get('/metrics')
        assert anonymous.status == 401 and anonymous.error_code == 'UNAUTHORIZED'
        wrong = api.client('not-a-token').get('/metrics')
        assert wrong.status == 401 and wrong.error_code == 'UNAUTHORIZED'
        user = api.a.get('/metrics')
        assert user.status == 403 and user.error_code == 'FORBIDDEN'
        assert api.admin.get('/metrics').status == 200
        scraper = api.client('scrape-secret-123').get('/metrics')
        assert scraper.status == 200
        assert b'aijob_http_requests_total' in scraper.body


def test_no_metrics_token_by_default(api):
    assert api.runtime.config.metrics_token is None
    assert api.client('').get('/metrics').status == 401


# ---------------------------------------------------------------- the kernel's signals
class Heard:
    """A receiver that writes down each signal it hears."""

    def __init__(self, name, heard):
        self.name, self.heard = name, heard

    def __getattr__(self, signal):
        return lambda *args: self.heard.append((self.name, signal) + args)


def test_each_signal_goes_to_every_receiver_in_order():
    heard = []
    signals = Signals([Heard('first', heard), Heard('second', heard)])
    signals.job_created('synthetic', 'ai-interactive')
    signals.job_finished('synthetic', 'ai-interactive', 'failed')
    signals.http_request('GET', '/healthz', 200, 0.001)
    assert heard == [
        ('first', 'job_created', 'synthetic', 'ai-interactive'),
        ('second', 'job_created', 'synthetic', 'ai-interactive'),
        ('first', 'job_finished', 'synthetic', 'ai-interactive', 'failed', None),
        ('second', 'job_finished', 'synthetic', 'ai-interactive', 'failed', None),
        ('first', 'http_request', 'GET', '/healthz', 200, 0.001),
        ('second', 'http_request', 'GET', '/healthz', 200, 0.001),
    ]


def test_without_the_metrics_extension_jobs_run_and_nothing_serves_metrics(make_runtime, backend):
    """Deleting engine/features/metrics/ and its line in engine/extensions.py leaves an engine
    that works: no /metrics route, no receiver, a job created and run to its end."""
    make_runtime()  # the schema, its tables emptied
    others = tuple(extension for extension in INSTALLED if extension.name != 'metrics')
    runtime = Runtime(backend.config(), role='test', extensions=others)
    try:
        assert runtime.hooks.signal_receivers == [] and 'metrics' not in runtime.features
        with runtime.store.connection():
            app = create_app(runtime)
            admin = TokenStore(runtime.store).create('root', admin=True)
            assert '/metrics' not in WsgiClient(app).get('/openapi.json').json['paths']
            missing = WsgiClient(app, admin).get('/metrics')
            assert missing.status == 404 and missing.error_code == 'NOT_FOUND'
            job = create_job(runtime, input={'output': {'ok': True}})
        assert ExecutionEngine(runtime, 'worker-plain').execute(job.id) == 'succeeded'
    finally:
        runtime.close()


# ---------------------------------------------------------------- real processes
def http_get(url, token=None):
    import urllib.error
    import urllib.request

    headers = {'Authorization': 'Bearer ' + token} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, reply.headers.get('Content-Type'), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get('Content-Type'), error.read()


def wait_answering(url, proc, timeout_s=30):
    def answering():
        assert proc.poll() is None, 'exited with %s' % proc.returncode
        try:
            return http_get(url)[0] in (200, 401)
        except OSError:
            return False

    wait_until(answering, timeout=timeout_s, interval=0.1)


@pytest.mark.slow
def test_worker_serves_metrics_on_its_own_port(backend, make_runtime, tmp_path):
    if backend.name != 'mysql+redis':
        pytest.skip('the worker process needs Redis')
    require_servers('mysql', 'redis')
    runtime = make_runtime()
    with runtime.store.connection():
        admin = TokenStore(runtime.store).create('root', admin=True)
        user = TokenStore(runtime.store).create('someone')
    port = free_port()
    web_folder = tmp_path / 'web-metrics'  # web's, in a shared environment: not the worker's
    web_folder.mkdir()
    env = dict(
        os.environ,
        PROMETHEUS_MULTIPROC_DIR=str(web_folder),
        **backend.env(AIJOB_METRICS_PORT=str(port)),
    )
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'worker'],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = 'http://127.0.0.1:%d/metrics' % port
    try:
        wait_answering(url, proc)
        status, content_type, body = http_get(url)
        assert status == 401 and content_type == 'application/json', body
        assert b'"UNAUTHORIZED"' in body
        assert http_get(url, user)[0] == 403
        with runtime.store.connection():
            job = create_job(runtime, input={'output': {'ok': True}})

        def finished():
            status, _, body = http_get(url, admin)
            assert status == 200
            samples = parse(body.decode('utf-8'))
            outcome = dict(SYNTHETIC, outcome='succeeded')
            return value(samples, 'aijob_jobs_finished_total', **outcome) == 1 and samples

        samples = wait_until(finished, timeout=20, interval=0.2)
        assert value(samples, 'aijob_job_queue_wait_seconds_count', **SYNTHETIC) == 1
        assert any(
            name == 'aijob_queue_depth' and dict(labels)['queue'] == 'ai-interactive'
            for name, labels in samples
        )
        assert job.id not in body.decode('utf-8')
        assert http_get('http://127.0.0.1:%d/other' % port, admin)[0] == 404
        assert list(web_folder.iterdir()) == []  # it counted in its own memory
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


@pytest.mark.slow
def test_web_with_two_workers_sums_their_counts_in_every_scrape(backend, make_runtime, tmp_path):
    runtime = make_runtime()
    with runtime.store.connection():
        admin = TokenStore(runtime.store).create('root', admin=True)
    port = free_port()
    temp = tmp_path / 'tmp'  # where web makes its metrics directory
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp), **backend.env())
    env.pop('PROMETHEUS_MULTIPROC_DIR', None)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'web', '--port', str(port)]
        + ['--workers', '2'],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = 'http://127.0.0.1:%d' % port
    sent = 0
    try:
        wait_answering(base + '/healthz', proc)
        (folder,) = temp.glob('aijob-metrics-*')

        def both_workers_counted():
            nonlocal sent
            threads = [
                threading.Thread(target=http_get, args=(base + '/openapi.json',)) for _ in range(10)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            sent += len(threads)
            pids = {name.split('_')[-1] for name in os.listdir(folder) if name.endswith('.db')}
            return len(pids) >= 2

        wait_until(both_workers_counted, timeout=60, interval=0)
        route = {'method': 'GET', 'route': '/openapi.json', 'status': '200'}
        for _ in range(6):  # whichever worker answers the scrape sums both
            status, _, body = http_get(base + '/metrics', admin)
            assert status == 200
            assert value(parse(body.decode('utf-8')), 'aijob_http_requests_total', **route) == sent
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert list(temp.glob('aijob-metrics-*')) == []  # removed by the master at exit
