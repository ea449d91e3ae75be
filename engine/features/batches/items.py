"""A job's call parked for a provider batch (``ai_provider_batch_item``): its states, the guard's
park and re-park, the batcher's outcome writes, and the wake-up of the jobs whose line has its
outcome.

An item moves waiting -> batched -> answered | failed | expired | cancelled -> consumed, each
move a compare-and-set on the state it leaves, so a step run again after a kill changes nothing
it already changed. ``parked_attempt`` is the job's lock (its ``attempt_no``) that was deferred
for the item last: a job whose ``attempt_no`` still equals it is deferred for this item alone,
which is what the batcher takes (a job still held by its worker, or deferred for something else
since, is left alone)."""

from ...core.history import NewEvent, insert_events
from ...core.models import AiJob
from ...core.outbox import WAKE_EVENT
from ...core.sql import placeholders, statement
from .models import AiProviderBatchItem

WAITING, BATCHED, ANSWERED, FAILED, EXPIRED, CANCELLED, CONSUMED = (
    'waiting',
    'batched',
    'answered',
    'failed',
    'expired',
    'cancelled',
    'consumed',
)
OUTCOMES = (ANSWERED, FAILED, EXPIRED)  # a line's outcome, which the job's next lock uses
# A job's call is still in the batch machinery's hands (its budget reservation stays).
OPEN_STATES = (WAITING, BATCHED, ANSWERED, FAILED, EXPIRED)
PARKED = 'batch'  # the reason of a parked job's deferral (JobDeferred.reason)
WAKE_BATCH = 500  # jobs woken per statement at most

_STATES = ', '.join("'%s'" % s for s in OUTCOMES)
# Jobs deferred for an item that has its outcome: running, unheld, still on the lock that
# parked them and not yet woken (their wake time is ahead).
_TO_WAKE = (
    'SELECT j.id, j.attempt_no, j.job_type, j.queue_name, j.priority '
    'FROM ai_provider_batch_item i JOIN ai_job j ON j.id = i.job_id '
    "WHERE i.state IN (%s) AND j.lifecycle_status = 'running' AND j.locked_by IS NULL "
    'AND j.attempt_no = i.parked_attempt AND j.lock_until > {now}' % _STATES
)
TO_WAKE = statement(_TO_WAKE + ' LIMIT %d' % WAKE_BATCH)


def custom_id(job_id, call_no):
    """The line's ``custom_id``: the job and its call, unique across every batch."""
    return '%s:%d' % (job_id, call_no)


def find(custom_id_):
    return AiProviderBatchItem.get_or_none(AiProviderBatchItem.custom_id == custom_id_)


def park(store, call, policy, request):
    """Insert the call's item, waiting for a batch (the guard, before the job's deferral)."""
    now = store.now()
    AiProviderBatchItem.insert(
        job_id=call.job.id,
        attempt_no=call.call_no,
        custom_id=custom_id(call.job.id, call.call_no),
        group_key=call.entry_key,
        state=WAITING,
        request=request,
        max_wait_ms=policy.max_wait_ms,
        max_jobs=policy.max_jobs,
        parked_attempt=call.job.attempt_no,
        created_at=now,
        updated_at=now,
    ).execute()


def repark(item_id, attempt_no):
    """A job woken before its line's outcome parks again on its new lock: True when the item
    was still waiting or batched (the job defers again), False when the outcome came meanwhile
    (the job uses it now)."""
    changed = (
        AiProviderBatchItem.update(parked_attempt=attempt_no)
        .where(
            (AiProviderBatchItem.id == item_id) & AiProviderBatchItem.state.in_((WAITING, BATCHED))
        )
        .execute()
    )
    return changed == 1


def consume(item_id):
    """The job's call used the item's outcome: in the transaction of the call's usage row, so
    an answer is used once."""
    AiProviderBatchItem.update(state=CONSUMED).where(
        (AiProviderBatchItem.id == item_id) & AiProviderBatchItem.state.in_(OUTCOMES + (CANCELLED,))
    ).execute()


def set_outcome(store, item_id, state, response=None, error_code=None, from_states=(BATCHED,)):
    """One line's outcome, if the item is still in one of ``from_states``; True when written."""
    changed = (
        AiProviderBatchItem.update(
            state=state, response=response, error_code=error_code, updated_at=store.now()
        )
        .where((AiProviderBatchItem.id == item_id) & AiProviderBatchItem.state.in_(from_states))
        .execute()
    )
    return changed == 1


def wake(store, outbox, tx, job_ids=None):
    """Wake the jobs deferred for an item that has its outcome (of ``job_ids``, or any), inside
    ``tx``: their wake time becomes now and a wake-up event goes to the outbox (due now; the
    leader's dispatcher pushes it), so a worker takes the job over and its guard uses the
    outcome. A job already woken, held, or deferred for something else is left alone. Returns
    how many were woken."""
    if job_ids is not None and not job_ids:
        return 0
    if job_ids is None:
        rows = store.execute(TO_WAKE).fetchall()
    else:
        query = statement(_TO_WAKE + ' AND j.id IN (%s)' % placeholders(len(job_ids)))
        rows = store.execute(query, list(job_ids)).fetchall()
    if not rows:
        return 0
    ids = [row[0] for row in rows]
    AiJob.update(lock_until=store.now()).where(
        AiJob.id.in_(ids) & AiJob.locked_by.is_null() & (AiJob.lifecycle_status == 'running')
    ).execute()
    for job_id, attempt_no, job_type, queue_name, priority in rows:
        payload = {'jobId': job_id, 'jobType': job_type, 'queueName': queue_name}
        payload['priority'] = priority
        outbox.create_in_transaction(
            tx,
            event_type=WAKE_EVENT,
            aggregate_type='AiJob',
            aggregate_id=job_id,
            dedupe_key='%s:%s:%d:batch' % (WAKE_EVENT, job_id, attempt_no),
            payload=payload,
        )
    return len(rows)


def insert_history(store, kind, job_ids, detail):
    """A ``kind`` row in the history of each job of ``job_ids``, at the job's attempt."""
    jobs = AiJob.select(AiJob.id, AiJob.attempt_no).where(AiJob.id.in_(list(job_ids)))
    insert_events(store, [NewEvent(job.id, kind, job.attempt_no, dict(detail)) for job in jobs])
