"""Terminal outbox events (contracts §4.1, architecture decision 15): the transition that makes a
job terminal writes its ``ai.job.<status>`` event in the same transaction, so a job that commits
once has exactly one, and an attempt that rolled back (a projector failure, a zombie) has none.
The dispatcher never pushes them to a job queue."""

import dataclasses
import threading
import time

import pytest

from engine.core.errors import JobLockConflictError
from engine.core.fences import Fence
from engine.core.models import AiJob, OutboxEvent
from engine.core.outbox import ENQUEUE_EVENT
from engine.execution.engine import ExecutionEngine
from tests.kernel.execution.test_execution import FlakyProjector
from tests.support.api import run_to_failed, run_to_running
from tests.support.helpers import create_job, wait_until
from tests.support.runtimes import fast_registry, run_job


def terminal_events(job_id):
    """(event type, dedupe key, status) of a job's events other than its enqueue event."""
    return [
        (e.event_type, e.dedupe_key, e.status)
        for e in OutboxEvent.select()
        .where((OutboxEvent.aggregate_id == job_id) & (OutboxEvent.event_type != ENQUEUE_EVENT))
        .order_by(OutboxEvent.id)
    ]


def test_each_terminal_write_adds_its_one_event(runtime):
    succeeded, failed, cancelled = (create_job(runtime, target_id=str(i)) for i in range(3))
    fence = run_to_running(runtime, succeeded.id)
    runtime.lifecycle.mark_succeeded(succeeded.id, fence=fence, output_hash='h')
    run_to_failed(runtime, failed.id)
    runtime.service.cancel_job(cancelled.id)  # queued → cancelled by its owner
    for job, status in ((succeeded, 'succeeded'), (failed, 'failed'), (cancelled, 'cancelled')):
        event = 'ai.job.%s' % status
        assert terminal_events(job.id) == [(event, '%s:%s' % (event, job.id), 'pending')]
        payload = OutboxEvent.get(OutboxEvent.event_type == event).payload
        assert payload == {'jobId': job.id, 'lifecycleStatus': status}  # ids only (§8.5)


def test_a_refused_terminal_write_adds_no_event(runtime):
    job = create_job(runtime)
    run_to_running(runtime, job.id)
    with pytest.raises(JobLockConflictError):  # a stale fence: another attempt holds the job
        runtime.lifecycle.mark_succeeded(job.id, fence=Fence('someone-else', 1))
    assert terminal_events(job.id) == []


def test_a_rolled_back_projection_transaction_leaves_no_event(runtime):
    job = create_job(runtime)
    fence = run_to_running(runtime, job.id)
    with pytest.raises(RuntimeError), runtime.store.atomic():
        runtime.lifecycle.mark_succeeded(job.id, fence=fence, output_hash='h')
        raise RuntimeError('the projector failed after the status write')
    assert AiJob.get_by_id(job.id).lifecycle_status == 'running'
    assert terminal_events(job.id) == []


def test_a_projector_failure_then_success_gives_exactly_one_event(make_engine_rt):
    synthetic = fast_registry().get('synthetic')
    engine_rt = make_engine_rt(dataclasses.replace(synthetic, projector='flaky'))
    projector = FlakyProjector()
    engine_rt.ai.projectors.add(projector)
    engine_rt.start_background()
    job = run_job(engine_rt, output={'v': 1})
    assert (job.lifecycle_status, projector.calls) == ('succeeded', 2)
    event = 'ai.job.succeeded'
    wait_until(lambda: terminal_events(job.id)[0][2] == 'published')  # fanned out
    assert terminal_events(job.id) == [(event, '%s:%s' % (event, job.id), 'published')]


@pytest.mark.slow
def test_a_zombie_attempt_leaves_no_event_beside_its_successor_s(engine_rt):
    job = create_job(engine_rt, input={'sleepMs': 2500})  # lock TTL 1.5 s, no heartbeat
    zombie, successor = (ExecutionEngine(engine_rt, name) for name in ('worker-a', 'worker-b'))
    outcome = {}

    def run(engine, name):
        with engine_rt.store.connection():
            outcome[name] = engine.execute(job.id)

    first = threading.Thread(target=run, args=(zombie, 'zombie'))
    first.start()
    wait_until(lambda: AiJob.get_by_id(job.id).lifecycle_status == 'running')
    time.sleep(1.7)  # the zombie's lock expires
    run(successor, 'successor')
    first.join(10)
    assert outcome == {'zombie': None, 'successor': 'succeeded'}
    event = 'ai.job.succeeded'
    assert terminal_events(job.id) == [(event, '%s:%s' % (event, job.id), 'pending')]


def test_the_dispatcher_leaves_terminal_events_to_the_webhook_fan_out(engine_rt):
    engine_rt.service.dispatch_now = None
    job = create_job(engine_rt)
    fence = run_to_running(engine_rt, job.id)
    engine_rt.lifecycle.mark_succeeded(job.id, fence=fence)
    assert engine_rt.dispatcher.cycle() == 1  # the enqueue event only
    assert engine_rt.queue.depth('ai-interactive') == 1
    assert terminal_events(job.id)[0][2] == 'pending'
    assert engine_rt.terminal_events.cycle() == 1
    assert terminal_events(job.id)[0][2] == 'published'
