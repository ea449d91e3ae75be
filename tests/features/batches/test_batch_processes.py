"""Provider batches through any restart (issue 22 item 4), on MariaDB + Redis with a real web
process and two worker processes: the leader worker is ``kill -9``-ed at each stage (after the
upload, after the batch is created, while polling, once the result files are read, and half-way
through writing the results), the other worker takes the lead over, and every job still ends once,
each ``custom_id`` is submitted exactly once, each job is projected once at the batch price."""

import os
import subprocess
import sys
import threading
from collections import Counter
from decimal import Decimal
from types import SimpleNamespace

import pytest

from engine.core.history import SUCCEEDED
from engine.core.models import AiJob, AiJobArtifact, AiJobEvent, AiUsageLog, LeaderLease
from engine.core.states import TERMINAL
from engine.features.batches.models import AiProviderBatch, AiProviderBatchItem
from engine.http.auth import TokenStore
from tests.support.backends import require_servers
from tests.support.batched_jobs import FAST_BATCHES, provider_settings
from tests.support.helpers import wait_until
from tests.support.runtimes import FAST_SETTINGS
from tests.support.servers import free_port, http, wait_healthy
from tests.support.worker_processes import ROOT

pytestmark = pytest.mark.slow

JOBS = 10  # one batch: tests.support.batched_jobs forms it when ten wait
CHUNK = 2  # result lines written per transaction
BATCH_COST = Decimal('0.012500')
STAGES = ('upload', 'create_batch', 'retrieve_batch', 'content', 'results')


@pytest.fixture
def cluster(make_runtime, backend, batch_fake, spawn, tmp_path):
    if backend.name != 'mysql+redis':
        pytest.skip('worker processes share a queue through Redis')
    require_servers('mysql', 'redis')
    settings = provider_settings(
        batch_fake.base_url,
        **FAST_SETTINGS,
        **FAST_BATCHES,
        AIJOB_DEFINITIONS='tests.support.batched_jobs',
        AIJOB_BATCH_RESULT_CHUNK=str(CHUNK),
    )
    rt = make_runtime(**settings)
    env = backend.env(**settings)
    port = free_port()
    log = open(tmp_path / 'web.log', 'wb')
    web = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'aijob.py'), 'web', '--port', str(port)]
        + ['--workers', '1'],
        cwd=ROOT,
        env=dict(os.environ, **env),
        stdout=log,
        stderr=log,
    )
    base = 'http://127.0.0.1:%d' % port
    try:
        wait_healthy(base, web, log_path=tmp_path / 'web.log')
        with rt.store.connection():
            token = TokenStore(rt.store).create('batcher')
            workers = [spawn(env), spawn(env)]
            yield SimpleNamespace(rt=rt, base=base, token=token, workers=workers)
    finally:
        web.terminate()
        web.wait(30)
        log.close()


def create(cluster):
    body = {'jobType': 'batched', 'targetType': 'note', 'targetId': 'n1', 'input': {}}
    response = http('POST', cluster.base + '/api/ai/jobs', cluster.token, body)
    assert response.status == 201, response.body
    return response.json['jobId']


def leader(cluster):
    holder = LeaderLease.get_by_id('housekeeping').holder
    return next(w for w in cluster.workers if ':%d:' % w.proc.pid in holder)


def kill_leader(cluster):
    with cluster.rt.store.connection():
        leader(cluster).kill()


def kill_leader_at(cluster, fake, event):
    """At the first ``event`` the fake serves: the provider did the work, the leader is killed
    before it hears the answer."""

    def hook(obj):
        fake.on(event, None)
        kill_leader(cluster)
        raise RuntimeError('killed before the answer')

    fake.on(event, hook)


def one_killed(cluster):
    return [w for w in cluster.workers if w.proc.poll() is not None]


def submitted_batch():
    return wait_until(
        lambda: AiProviderBatch.select().where(AiProviderBatch.state == 'submitted').first(),
        timeout=60,
    )


def hold_items(item_ids, held, release):
    """Lock ``item_ids`` until ``release``: the leader's write of their chunk waits on them."""
    from engine.core.models import database

    with database.connection_context():
        with database.atomic():
            list(
                AiProviderBatchItem.select()
                .where(AiProviderBatchItem.id.in_(item_ids))
                .for_update()
            )
            held.set()
            release.wait(60)


def kill_half_way_through_results(cluster, fake, batch):
    items = list(
        AiProviderBatchItem.select()
        .where(AiProviderBatchItem.batch_id == batch.id)
        .order_by(AiProviderBatchItem.id)
    )
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=hold_items, args=([i.id for i in items[CHUNK:]], held, release)
    )
    holder.start()
    try:
        assert held.wait(10)
        fake.set_status(batch.provider_batch_id, 'completed')
        written = AiProviderBatchItem.select().where(
            (AiProviderBatchItem.batch_id == batch.id) & (AiProviderBatchItem.state != 'batched')
        )
        wait_until(lambda: written.count() >= CHUNK, timeout=60)  # the first chunk committed
        kill_leader(cluster)  # while its second chunk waits on the held rows
        assert written.count() == CHUNK
    finally:
        release.set()
        holder.join(10)


@pytest.mark.parametrize('stage', STAGES)
def test_kill_9_of_the_leader_at_each_stage_loses_and_repeats_nothing(cluster, batch_fake, stage):
    batch_fake.mode = 'manual'
    if stage in ('upload', 'create_batch'):
        kill_leader_at(cluster, batch_fake, stage)
    job_ids = [create(cluster) for _ in range(JOBS)]
    batch = submitted_batch()
    if stage == 'retrieve_batch':
        kill_leader_at(cluster, batch_fake, stage)
        wait_until(lambda: one_killed(cluster), timeout=30)
    if stage == 'content':
        kill_leader_at(cluster, batch_fake, stage)
    if stage == 'results':
        kill_half_way_through_results(cluster, batch_fake, batch)
    else:
        batch_fake.set_status(batch.provider_batch_id, 'completed')

    def finished():
        jobs = list(AiJob.select().where(AiJob.id.in_(job_ids)))
        return jobs if all(job.lifecycle_status in TERMINAL for job in jobs) else None

    jobs = wait_until(finished, timeout=90)
    assert {job.lifecycle_status for job in jobs} == {'succeeded'}
    assert len(one_killed(cluster)) == 1  # the leader died at this stage
    assert Counter(batch_fake.submitted_custom_ids) == {'%s:1' % j: 1 for j in job_ids}
    assert (len(batch_fake.uploads), len(batch_fake.batches)) == (1, 1)
    rows = list(AiUsageLog.select().where(AiUsageLog.job_id.in_(job_ids)))
    assert sorted(row.job_id for row in rows) == sorted(job_ids)  # one row a job
    assert {(row.cost, row.batch_id) for row in rows} == {(BATCH_COST, batch.id)}
    for job_id in job_ids:
        succeeded = AiJobEvent.select().where(
            (AiJobEvent.job_id == job_id) & (AiJobEvent.kind == SUCCEEDED)
        )
        assert succeeded.count() == 1
        assert AiJobArtifact.select().where(AiJobArtifact.job_id == job_id).count() == 1
    ended = wait_until(lambda: AiProviderBatch.get_by_id(batch.id).state == 'ended', timeout=30)
    assert ended
    print(
        'stage %s: %d jobs, %d batch, %d usage rows at %s, %d custom_ids each submitted once'
        % (stage, len(jobs), len(batch_fake.batches), len(rows), BATCH_COST, len(job_ids))
    )
