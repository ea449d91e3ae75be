"""The operators' dashboard (/dashboard): sign-in with an admin token for a session cookie, CSRF
on every action, user tokens refused, every value escaped; in-process on both backend pairs, and
in a real browser (chromium driven by Playwright) against a real ``serve`` process."""

import datetime
import hashlib
import os
import re
import subprocess
import sys
import time

import pytest

from engine.core.models import AiJob, AiUsageLog
from engine.core.states import CANCELLED, QUEUED, RUNNING
from engine.features.dashboard.models import DashboardSession
from engine.http.app import create_app
from engine.http.auth import TokenStore
from tests.kernel.http.test_api_serve import ROOT
from tests.support.api import run_to_failed, run_to_running
from tests.support.busy_users import ORDER, craft
from tests.support.dashboard import FormClient
from tests.support.helpers import create_job
from tests.support.servers import free_port, http, wait_healthy

XSS = '<script>window.__pwned = 1</script>'


@pytest.fixture
def board(engine_rt):
    """The app, an admin token, a user token, and a signed-in operator."""
    runtime = engine_rt
    tokens = TokenStore(runtime.store)

    class Board:
        app = create_app(runtime)
        admin_token = tokens.create('root', admin=True)
        user_token = tokens.create('user-a')
        rt = runtime

        def client(self):
            return FormClient(self.app)

        def operator(self):
            client = self.client()
            assert client.sign_in(self.admin_token).status == 303
            return client

    return Board()


# ---------------------------------------------------------------- signing in and out
def test_an_admin_token_signs_in_for_an_httponly_strict_cookie_and_only_its_hash_is_kept(board):
    client = board.client()
    response = client.sign_in(board.admin_token)
    assert response.status == 303 and response.header('Location') == '/dashboard'
    cookie = response.cookies()['aijob_session']
    assert cookie['httponly'] and cookie['samesite'].lower() == 'strict'
    assert cookie['path'] == '/dashboard'
    session_id = cookie.value
    rows = list(DashboardSession.select().dicts())
    assert [row['session_hash'] for row in rows] == [
        hashlib.sha256(session_id.encode()).hexdigest()
    ]
    assert session_id not in repr(rows) and board.admin_token not in repr(rows)
    page = client.get('/dashboard')
    assert page.status == 200 and 'Overview' in page.text and 'root' in page.text
    again = client.get('/dashboard/login')  # signed in already: to the overview
    assert again.status == 303 and again.header('Location') == '/dashboard'


def test_a_user_token_is_refused_with_403_and_opens_no_session(board):
    client = board.client()
    response = client.sign_in(board.user_token)
    assert response.status == 403
    assert 'SUPER_ADMIN' in response.text
    assert 'aijob_session' not in response.cookies()
    assert DashboardSession.select().count() == 0
    assert client.get('/dashboard').status == 303  # still signed out


def test_an_unknown_token_is_401_and_opens_no_session(board):
    response = board.client().sign_in('aj_' + 'x' * 40)
    assert response.status == 401 and DashboardSession.select().count() == 0


def test_pages_send_a_browser_to_sign_in_and_answer_json_401_otherwise(board):
    client = board.client()
    page = client.get('/dashboard/jobs')
    assert page.status == 303 and page.header('Location') == '/dashboard/login'
    api = client.get('/dashboard/jobs', accept='application/json')
    assert api.status == 401
    assert api.header('Content-Type').startswith('application/json')
    assert '"code": "UNAUTHORIZED"' in api.text


def test_a_cookie_the_standard_parser_refuses_changes_nothing(board):
    """Another site's cookie on the same host with a name Python's parser refuses (``@``): the
    contract run's malformed Cookie header made this a 500. Signed out it is 401; signed in
    the session still holds."""
    stranger = board.client()
    stranger.jar['a@b'] = '2'
    api = stranger.get('/dashboard/jobs', accept='application/json')
    assert api.status == 401 and '"code": "UNAUTHORIZED"' in api.text
    operator = board.operator()
    operator.jar['a@b'] = '2'
    page = operator.get('/dashboard/jobs')
    assert page.status == 200 and 'root' in page.text


def test_sign_in_without_the_forms_own_token_is_refused(board):
    client = board.client()
    response = client.post('/dashboard/login', {'token': board.admin_token})
    assert response.status == 403 and 'CSRF_TOKEN_INVALID' in response.text
    assert DashboardSession.select().count() == 0


def test_sign_out_ends_the_session(board):
    client = board.operator()
    stolen = dict(client.jar)
    overview = client.get('/dashboard')
    response = client.post('/dashboard/logout', {'csrf': overview.csrf()})
    assert response.status == 303 and 'aijob_session' not in client.jar
    assert 'Signed out.' in client.get(response.header('Location')).text
    assert DashboardSession.select().count() == 0
    replay = board.client()
    replay.jar.update(stolen)  # the old cookie is worth nothing now
    assert replay.get('/dashboard').status == 303


def test_revoking_the_admin_token_ends_its_sessions(board):
    client = board.operator()
    assert client.get('/dashboard').status == 200
    TokenStore(board.rt.store).revoke(board.admin_token)
    assert client.get('/dashboard').status == 303


def test_a_session_expires(make_runtime):
    runtime = make_runtime(AIJOB_DASHBOARD_SESSION_MS='300')
    with runtime.store.connection():
        token = TokenStore(runtime.store).create('root', admin=True)
        client = FormClient(create_app(runtime))
        assert client.sign_in(token).status == 303
        time.sleep(0.4)
        assert client.get('/dashboard').status == 303


# ---------------------------------------------------------------- CSRF
def cancel_form(client, job_id):
    return client.get('/dashboard/jobs/%s' % job_id)


def test_an_action_without_the_csrf_token_is_refused_and_changes_nothing(board):
    job = create_job(board.rt)
    client = board.operator()
    page = cancel_form(client, job.id)
    for form in ({}, {'csrf': 'f' * 64}, {'csrf': page.csrf()[:-1] + 'x'}):
        response = client.post('/dashboard/jobs/%s/cancel' % job.id, form)
        assert response.status == 403 and 'CSRF_TOKEN_INVALID' in response.text
    json_answer = client.post('/dashboard/jobs/%s/cancel' % job.id, {}, accept='*/*')
    assert json_answer.status == 403 and '"CSRF_TOKEN_INVALID"' in json_answer.text
    assert AiJob.get_by_id(job.id).lifecycle_status == QUEUED
    # Another session's token does not do either.
    other = board.operator().get('/dashboard').csrf()
    assert client.post('/dashboard/jobs/%s/cancel' % job.id, {'csrf': other}).status == 403
    assert AiJob.get_by_id(job.id).lifecycle_status == QUEUED


def test_an_action_from_another_origin_is_refused_even_with_the_token(board):
    job = create_job(board.rt)
    client = board.operator()
    csrf = cancel_form(client, job.id).csrf()
    response = client.post(
        '/dashboard/jobs/%s/cancel' % job.id, {'csrf': csrf}, origin='https://evil.example'
    )
    assert response.status == 403
    assert AiJob.get_by_id(job.id).lifecycle_status == QUEUED
    same = client.post('/dashboard/jobs/%s/cancel' % job.id, {'csrf': csrf}, origin='http://test')
    assert same.status == 303
    assert AiJob.get_by_id(job.id).lifecycle_status == CANCELLED


def test_an_action_without_a_session_is_401(board):
    job = create_job(board.rt)
    response = board.client().post('/dashboard/jobs/%s/cancel' % job.id, {'csrf': 'x'})
    assert response.status == 401
    assert AiJob.get_by_id(job.id).lifecycle_status == QUEUED


# ---------------------------------------------------------------- pages and actions
def test_job_input_and_messages_are_shown_as_text(board):
    job = create_job(board.rt, input={'note': XSS}, target_id='<b>t</b>')
    failed = run_to_failed(board.rt, create_job(board.rt, input={'note': XSS}).id, internal=XSS)
    client = board.operator()
    for page in (
        client.get('/dashboard/jobs/%s' % job.id),
        client.get('/dashboard/jobs/%s' % failed.id),
        client.get('/dashboard/jobs'),
        client.get('/dashboard/jobs', {'userId': XSS}),
    ):
        assert page.status == 200
        assert '<script>window' not in page.text and '<b>t' not in page.text
        assert len(re.findall(r'<script\b', page.text)) == 1  # the dashboard's own file only
    detail = client.get('/dashboard/jobs/%s' % failed.id).text
    assert '&lt;script&gt;window.__pwned = 1&lt;/script&gt;' in detail
    assert 'PROVIDER_UNAVAILABLE' in detail


def test_pages_forbid_inline_script_and_framing(board):
    page = board.operator().get('/dashboard')
    policy = page.header('Content-Security-Policy')
    assert "script-src 'self'" in policy and 'unsafe-inline' not in policy
    assert "frame-ancestors 'none'" in policy
    assert page.header('Cache-Control') == 'no-store'


def test_the_job_list_filters_pages_by_keyset_and_finds_a_job_by_id(board):
    jobs = [create_job(board.rt, user_id='user-%d' % (i % 2)) for i in range(5)]
    client = board.operator()
    page = client.get('/dashboard/jobs', {'userId': 'user-0'})
    shown = re.findall(r'/dashboard/jobs/([0-9a-f-]{36})"', page.text)
    assert shown == [j.id for j in reversed(jobs) if j.user_id == 'user-0']
    first = client.get('/dashboard/jobs', {'limit': '2'})
    first_ids = re.findall(r'/dashboard/jobs/([0-9a-f-]{36})"', first.text)
    assert first_ids == [j.id for j in reversed(jobs)][:2]
    next_link = re.search(r'href="/dashboard/jobs\?([^"]+)" rel="next"', first.text).group(1)
    query = dict(part.split('=', 1) for part in next_link.replace('&amp;', '&').split('&'))
    second = client.get('/dashboard/jobs', query)
    assert (
        re.findall(r'/dashboard/jobs/([0-9a-f-]{36})"', second.text)
        == [j.id for j in reversed(jobs)][2:4]
    )
    found = client.get('/dashboard/jobs', {'jobId': jobs[0].id})
    assert found.status == 303 and found.header('Location') == '/dashboard/jobs/' + jobs[0].id
    bad = client.get('/dashboard/jobs', {'createdFrom': 'yesterday'})
    assert bad.status == 200 and 'createdFrom must be an ISO-8601 time' in bad.text
    assert client.get('/dashboard/jobs/%s' % ('0' * 36)).status == 404


def test_the_live_part_of_a_page_is_served_alone_and_says_when_it_is_final(board):
    job = create_job(board.rt)
    client = board.operator()
    live = client.get('/dashboard/jobs/%s' % job.id, {'part': 'live'})
    assert live.header('X-Dashboard-Part') == 'live' and live.header('X-Dashboard-Final') is None
    assert '<html' not in live.text and 'id="status"' in live.text
    csrf = client.get('/dashboard').csrf()
    client.post('/dashboard/jobs/%s/cancel' % job.id, {'csrf': csrf})
    final = client.get('/dashboard/jobs/%s' % job.id, {'part': 'live'})
    assert final.header('X-Dashboard-Final') == '1' and 'cancelled' in final.text


def test_cancel_and_retry_from_the_job_page(board):
    running = create_job(board.rt)
    run_to_running(board.rt, running.id)
    failed = run_to_failed(board.rt, create_job(board.rt).id)
    client = board.operator()
    csrf = client.get('/dashboard').csrf()
    response = client.post('/dashboard/jobs/%s/cancel' % running.id, {'csrf': csrf})
    assert response.status == 303
    notice = client.get(response.header('Location'))
    assert 'Cancel requested' in notice.text
    assert AiJob.get_by_id(running.id).cancel_requested_at is not None
    assert AiJob.get_by_id(running.id).lifecycle_status == RUNNING
    again = client.post('/dashboard/jobs/%s/cancel' % failed.id, {'csrf': csrf})
    assert again.status == 409 and 'JOB_NOT_CANCELLABLE' in again.text
    retried = client.post('/dashboard/jobs/%s/retry' % failed.id, {'csrf': csrf})
    assert retried.status == 303
    new_id = retried.header('Location').split('/')[-1].split('?')[0]
    new_job = AiJob.get_by_id(new_id)
    assert new_job.retry_of_job_id == failed.id and new_job.lifecycle_status == QUEUED
    page = client.get('/dashboard/jobs/%s' % failed.id).text
    assert 'retried as' in page and new_id in page
    refused = client.post('/dashboard/jobs/%s/retry' % new_id, {'csrf': csrf})
    assert refused.status == 409 and 'JOB_NOT_RETRYABLE' in refused.text


def test_bulk_retry_of_failed_jobs_of_a_type_since_a_time_retries_each_once(board):
    rt = board.rt
    failed = [run_to_failed(rt, create_job(rt).id) for _ in range(3)]
    other_type = run_to_failed(rt, create_job(rt, job_type='synthetic_bg').id)
    client = board.operator()
    csrf = client.get('/dashboard').csrf()
    since = (rt.store.clock() - datetime.timedelta(minutes=5)).strftime('%Y-%m-%dT%H:%M')
    form = {'csrf': csrf, 'jobType': 'synthetic', 'since': since}
    response = client.post('/dashboard/retry-failed', form)
    assert response.status == 303
    assert 'Retried 3 failed jobs' in client.get(response.header('Location')).text
    retries = AiJob.select().where(AiJob.retry_of_job_id.is_null(False))
    assert sorted(j.retry_of_job_id for j in retries) == sorted(j.id for j in failed)
    assert other_type.id not in {j.retry_of_job_id for j in retries}
    again = client.post('/dashboard/retry-failed', form)
    assert 'Retried 0 failed jobs' in client.get(again.header('Location')).text
    future = dict(form, since=(rt.store.clock() + datetime.timedelta(hours=1)).isoformat())
    client.post('/dashboard/retry-failed', future)
    unknown = client.post('/dashboard/retry-failed', dict(form, jobType='nope'))
    assert unknown.status == 400 and 'UNKNOWN_JOB_TYPE' in unknown.text
    missing = client.post('/dashboard/retry-failed', dict(form, since=''))
    assert missing.status == 400
    assert AiJob.select().where(AiJob.retry_of_job_id.is_null(False)).count() == 3


def test_the_overview_counts_jobs_and_shows_live_workers_with_what_they_run(board):
    rt = board.rt
    queued = create_job(rt)
    running = create_job(rt, job_type='synthetic_bg')
    run_to_running(rt, running.id, instance='worker-one')
    rt.queue.heartbeat('worker-one', 60_000)
    run_to_failed(rt, create_job(rt).id)
    page = board.operator().get('/dashboard')
    assert page.status == 200
    card = r'<span class="n">(\d+)</span>\s*<span class="l">([^<]+)</span>'
    cards = {label: int(n) for n, label in re.findall(card, page.text)}
    assert (cards['queued'], cards['running'], cards['failed (24 h)']) == (1, 1, 1)
    assert 'worker-one' in page.text and running.id[:8] in page.text
    assert queued.id not in page.text
    assert '1 jobs finished' in page.text


def test_the_overview_shows_the_busiest_users_and_links_to_their_jobs(board):
    craft(board.rt)
    client = board.operator()
    page = client.get('/dashboard')
    table = re.search(r'<table id="busiest-users">.*?</table>', page.text, re.S).group(0)
    rows = re.findall(r'<tr>\s*<td><a href="[^"]*">([^<]+)</a></td>(.*?)</tr>', table, re.S)
    assert [user for user, _ in rows] == ORDER
    cells = {user: re.findall(r'<td>(?:<a [^>]*>)?([^<]*)', rest) for user, rest in rows}
    # waiting, running, oldest waiting, p50, p95, started in the window
    assert cells['user-heavy'][:2] == ['3', '1']
    assert cells['user-heavy'][3:] == ['10.000 s', '19.000 s', '20']
    assert cells['user-light'] == ['0', '2', '–', '0.500 s', '1.500 s', '2']
    assert cells['user-idle'][:2] == ['5', '0'] and cells['user-idle'][3:] == ['–', '–', '0']
    # The live part (refreshed every few seconds) carries the panel too.
    assert 'id="busiest-users"' in client.get('/dashboard', {'part': 'live'}).text
    # A user's waiting count links to the jobs page filtered by that user and status.
    link = re.search(
        r'href="(/dashboard/jobs\?userId=user-idle&amp;lifecycleStatus=queued)"', table
    )
    jobs = client.get(link.group(1).replace('&amp;', '&'))
    shown = re.findall(r'/dashboard/jobs/([0-9a-f-]{36})"', jobs.text)
    wanted = AiJob.select().where(
        (AiJob.user_id == 'user-idle') & (AiJob.lifecycle_status == QUEUED)
    )
    assert sorted(shown) == sorted(job.id for job in wanted) and len(shown) == 5


def test_a_busy_users_id_is_shown_as_text(board):
    create_job(board.rt, user_id=XSS)
    page = board.operator().get('/dashboard')
    assert XSS not in page.text and '&lt;script&gt;window.__pwned = 1&lt;/script&gt;' in page.text


def test_the_overview_says_when_no_user_is_busy(board):
    page = board.operator().get('/dashboard')
    assert 'No user has a job waiting or running.' in page.text


def test_usage_totals_by_user_and_job_type(board):
    rt = board.rt
    job = create_job(rt, user_id='alice')
    AiUsageLog.insert(
        job_id=job.id,
        user_id='alice',
        job_type='synthetic',
        attempt_no=1,
        credential_mode='platform_key',
        provider='synthetic',
        model='synthetic-1',
        prompt_tokens=120,
        completion_tokens=30,
        cost='0.012500',
        created_at=rt.store.now(),
    ).execute()
    client = board.operator()
    page = client.get('/dashboard/usage')
    assert page.status == 200
    assert re.search(
        r'<td>alice</td><td>1</td><td>120</td>\s*<td>30</td><td>0.012500</td>', page.text
    )
    assert re.search(r'<td>synthetic</td><td>1</td><td>120</td>', page.text)
    empty = client.get(
        '/dashboard/usage', {'since': '2001-01-01T00:00', 'until': '2001-01-02T00:00'}
    )
    assert 'No calls.' in empty.text
    assert client.get('/dashboard/usage', {'part': 'live'}).header('X-Dashboard-Part') is None
    bad = client.get('/dashboard/usage', {'since': 'then'})
    assert 'since must be an ISO-8601 time' in bad.text


def test_static_files_are_served_and_nothing_else(board):
    client = board.client()
    css = client.get('/dashboard/static/dashboard.css')
    assert css.status == 200 and css.header('Content-Type').startswith('text/css')
    assert client.get('/dashboard/static/dashboard.js').status == 200
    assert client.get('/dashboard/static/..%2Fapp.py').status == 404
    assert client.get('/dashboard/static/nope.css').status == 404


# ---------------------------------------------------------------- in a real browser
@pytest.fixture
def served(backend, make_runtime, tmp_path):
    """``python aijob.py serve`` on this backend: (base URL, its admin token, a user token)."""
    runtime = make_runtime()  # a clean store for this backend
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'serve'],
        cwd=str(tmp_path),
        env=dict(os.environ, **backend.env(AIJOB_PORT=str(port))),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        admin = [proc.stdout.readline().strip() for _ in range(3)][-1]
        base = 'http://127.0.0.1:%d' % port
        wait_healthy(base, proc)
        with runtime.store.connection():
            user = TokenStore(runtime.store).create('user-a')
        yield base, admin, user
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


def submit(base, token, **input):
    body = {'jobType': 'synthetic', 'targetType': 'note', 'targetId': 'n1', 'input': input}
    response = http('POST', base + '/api/ai/jobs', token, body)
    assert response.status == 201, response
    return response.json['jobId']


def status_of(page):
    return page.locator('#status').inner_text()


def wait_status(page, status, timeout_s=30.0):
    """Wait, without reloading, until the page's live part shows ``status``."""
    deadline = time.monotonic() + timeout_s
    while status_of(page) != status:
        assert time.monotonic() < deadline, 'still %s, not %s' % (status_of(page), status)
        page.wait_for_timeout(200)


def fits_the_screen(page):
    return page.evaluate('document.documentElement.scrollWidth <= window.innerWidth + 1')


def refuse_a_user_token(chromium, base, user):
    context = chromium.new_context()
    page = context.new_page()
    page.goto(base + '/dashboard')
    assert page.url == base + '/dashboard/login'
    page.fill('#token', user)
    with page.expect_response(lambda r: r.request.method == 'POST') as answer:
        page.click('button[type=submit]')
    assert answer.value.status == 403
    assert 'SUPER_ADMIN' in page.locator('.alert').inner_text()
    assert 'aijob_session' not in {cookie['name'] for cookie in context.cookies()}
    context.close()


@pytest.mark.slow
def test_in_a_browser_users_are_refused_and_an_operator_follows_cancels_and_retries(
    chromium, served, tmp_path
):
    base, admin, user = served
    refuse_a_user_token(chromium, base, user)
    context = chromium.new_context(viewport={'width': 1280, 'height': 900})
    page = context.new_page()
    errors, dialogs = [], []
    page.on('console', lambda msg: errors.append(msg.text) if msg.type == 'error' else None)
    page.on('pageerror', lambda exc: errors.append(str(exc)))
    page.on('dialog', lambda dialog: (dialogs.append(dialog.message), dialog.accept()))

    # Sign in with the admin token: the session cookie is HttpOnly and SameSite=Strict.
    page.goto(base + '/dashboard')
    page.fill('#token', admin)
    page.click('button[type=submit]')
    assert page.url == base + '/dashboard'
    session = {c['name']: c for c in context.cookies()}['aijob_session']
    assert session['httpOnly'] and session['sameSite'] == 'Strict'
    assert page.evaluate('document.cookie').find('aijob_session') == -1

    # A job created now appears in the list by itself, and its progress reaches 100.
    page.click('nav >> text=Jobs')
    followed = submit(base, user, sleepMs=8000, progressSteps=8, note=XSS)
    link = page.locator('a[href="/dashboard/jobs/%s"]' % followed)
    link.wait_for(timeout=15_000)
    link.click()
    seen = set()
    deadline = time.monotonic() + 30
    while status_of(page) != 'succeeded':
        assert time.monotonic() < deadline, status_of(page)
        seen.add(int(page.locator('#progress').get_attribute('value')))
        page.wait_for_timeout(150)
    assert page.locator('#progress').get_attribute('value') == '100'
    timeline = page.locator('ol.timeline strong').all_inner_texts()
    assert timeline[0] == 'created' and timeline[-1] == 'succeeded' and 'started' in timeline
    assert seen - {0, 100}, 'no progress in between was shown: %s' % sorted(seen)
    # The input is user data: shown as text, never run.
    assert XSS in page.locator('#input').inner_text()
    assert page.evaluate('window.__pwned') is None
    page.screenshot(path=str(tmp_path / 'job.png'), full_page=True)

    # Cancel a running job, after the confirmation.
    long_job = submit(base, user, sleepMs=60_000, progressSteps=60)
    page.goto(base + '/dashboard/jobs/' + long_job)
    wait_status(page, 'running')
    page.click('text=Cancel job')
    wait_status(page, 'cancelled')
    assert dialogs == ['Cancel job %s?' % long_job]

    # Retry a failed job: a new job, linked to the old one.
    broken = submit(base, user, failWith='VALIDATION_SCHEMA')
    page.goto(base + '/dashboard/jobs/' + broken)
    wait_status(page, 'failed')
    assert 'VALIDATION_SCHEMA' in page.locator('.failure').inner_text()
    page.click('text=Retry as a new job')
    page.wait_for_url(re.compile(r'.*/dashboard/jobs/(?!%s)[0-9a-f-]{36}\?notice=retried' % broken))
    assert page.locator('a[href="/dashboard/jobs/%s"]' % broken).count() == 1
    assert len(dialogs) == 2

    # The overview, on a laptop and on a phone.
    page.goto(base + '/dashboard')
    page.locator('figure.chart svg').wait_for()
    assert 'succeeded' in page.locator('.cards').inner_text()
    page.screenshot(path=str(tmp_path / 'overview.png'), full_page=True)
    phone = chromium.new_context(viewport={'width': 390, 'height': 844}, is_mobile=True)
    phone.add_cookies(context.cookies())
    small = phone.new_page()
    small.on('console', lambda msg: errors.append(msg.text) if msg.type == 'error' else None)
    small.on('pageerror', lambda exc: errors.append(str(exc)))
    for path in ('', '/jobs', '/jobs/' + followed, '/usage'):
        small.goto(base + '/dashboard' + path)
        assert fits_the_screen(small), path
    small.goto(base + '/dashboard')
    small.screenshot(path=str(tmp_path / 'overview-phone.png'), full_page=True)
    phone.close()

    # Sign out: the session is over.
    page.click('text=Sign out')
    assert page.url.startswith(base + '/dashboard/login')
    page.goto(base + '/dashboard/jobs')
    assert page.url == base + '/dashboard/login'
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ('job.png', 'overview.png'))
    assert errors == []
    context.close()


def test_bulk_retry_leaves_the_jobs_of_a_user_over_its_limit_for_a_later_run(make_runtime):
    from tests.support.runtimes import fast_registry

    rt = make_runtime(registry=fast_registry(), AIJOB_MAX_ACTIVE_JOBS_PER_USER='2')
    with rt.store.connection():
        failed = [run_to_failed(rt, create_job(rt).id) for _ in range(2)]
        create_job(rt)  # one active job: one retry more reaches the limit
        client = FormClient(create_app(rt))
        client.sign_in(TokenStore(rt.store).create('root', admin=True))
        since = (rt.store.clock() - datetime.timedelta(minutes=5)).isoformat()
        form = {'csrf': client.get('/dashboard').csrf(), 'jobType': 'synthetic', 'since': since}
        response = client.post('/dashboard/retry-failed', form)
        notice = client.get(response.header('Location')).text
        assert 'Retried 1 failed jobs; 1 refused by their users&#039; limits.' in notice
        retries = AiJob.select().where(AiJob.retry_of_job_id.is_null(False))
        retried = [job.retry_of_job_id for job in retries]
        assert retried == [failed[0].id]


def test_a_session_opened_by_one_web_process_holds_in_another(make_runtime):
    first, second = make_runtime(role='web-1'), make_runtime(role='web-2')
    with first.store.connection():
        token = TokenStore(first.store).create('root', admin=True)
        client = FormClient(create_app(first))
        assert client.sign_in(token).status == 303
    with second.store.connection():
        elsewhere = FormClient(create_app(second))
        elsewhere.jar.update(client.jar)
        page = elsewhere.get('/dashboard')
        assert page.status == 200 and 'root' in page.text
