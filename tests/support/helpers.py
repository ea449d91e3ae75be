"""Small helpers shared by the tests."""

import threading
import time

from engine.core import sql
from engine.core.service import CreateJobInput


def new_request(job_type='synthetic', user_id='user-a', key=None, input=None, **kw):
    return CreateJobInput(
        user_id=user_id,
        job_type=job_type,
        target_type='note',
        target_id=kw.pop('target_id', 'note-1'),
        input=input or {},
        idempotency_key=key,
        **kw,
    )


def create_job(runtime, **kw):
    return runtime.service.create_job(new_request(**kw)).job


def row(model, pk):
    """A row's column values as a dict, for before/after comparisons."""
    return model.select().where(model._meta.primary_key == pk).dicts().get()


def run_threads(count, target, store):
    """Start ``count`` threads at once on ``target(i)``; return results and exceptions."""
    barrier = threading.Barrier(count)
    results, errors = [None] * count, [None] * count

    def worker(i):
        barrier.wait(30)
        with store.connection():  # may wait for a pooled connection: that is part of the race
            try:
                results[i] = target(i)
            except Exception as exc:  # collected for the test to assert on
                errors[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors


def wait_until(predicate, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError('condition not reached within %.1fs' % timeout)


def record_sent_statements(monkeypatch, store):
    """From now on in this test, the text of every batch of statements that sql.send sends
    (the rows of a ``rows_together`` block's end, in their order), each batch a list; the
    statements still go to the database."""
    sent = []
    real_send = sql.send

    def recording_send(planned, commit=False):
        sent.append([made.text(store.dialect) for made, _, _ in planned])
        return real_send(planned, commit=commit)

    monkeypatch.setattr(sql, 'send', recording_send)
    return sent
