"""Forming and submitting provider batches: the waiting items of one route entry become a batch
row when ``max_jobs`` wait or the oldest has waited ``max_wait_ms``; the batch's JSONL is uploaded
and the batch created at the provider.

Each step stores what it got before the next starts, and looks for its own earlier work before
doing it again, so a process killed at any point resumes without sending anything twice: the
upload first looks for the file ``aijob-<batch row id>.jsonl``, the create for the batch whose
metadata names the row. An item is in one batch row (the form is one transaction that moves
its items waiting -> batched), so a ``custom_id`` is in one created batch."""

import calendar
import json

from ...core.history import BATCH_SUBMITTED
from ...core.logs import log_event
from ...core.models import AiJob, new_id
from ...core.registry import MAX_BATCH_JOBS
from . import items
from .items import BATCHED, CANCELLED, WAITING
from .models import AiProviderBatch, AiProviderBatchItem

BUILDING, UPLOADED, SUBMITTED, CANCELLING, ENDED = (
    'building',
    'uploaded',
    'submitted',
    'cancelling',
    'ended',
)
FORM_SCAN = MAX_BATCH_JOBS  # waiting items looked at per step: a group's max_jobs fits in one
TERMINAL = ('succeeded', 'failed', 'cancelled')
LINE_URL = '/v1/chat/completions'
# A row's file and batch are made after the row; the provider's clock may run behind ours by
# this much at most, so a listed entry older than the row's creation minus this is not ours.
CLOCK_MARGIN_S = 3600


def listed_since(batch):
    """The Unix time before which no provider file or batch of the row can have been made."""
    return calendar.timegm(batch.created_at.utctimetuple()) - CLOCK_MARGIN_S


def input_filename(batch_id):
    return 'aijob-%s.jsonl' % batch_id


def jsonl(batch_items):
    """The batch's input file: one line per item, the request exactly as parked."""
    lines = (
        json.dumps(
            {'custom_id': item.custom_id, 'method': 'POST', 'url': LINE_URL, 'body': item.request},
            separators=(',', ':'),
            ensure_ascii=False,
        )
        for item in batch_items
    )
    return ('\n'.join(lines) + '\n').encode('utf-8')


class Batcher:
    def __init__(self, store, apis, poll_first_ms):
        self.store = store
        self.apis = apis  # apis(provider name) -> its BatchApi
        self.poll_first_ms = poll_first_ms

    # ---------------------------------------------------------------- form
    def form(self):
        """Batch rows for the groups that are due; returns the ids of the rows made."""
        now = self.store.clock()
        ready, gone = self._waiting()
        if gone:
            self.store.run_in_transaction(lambda tx: self._cancel_items(gone))
        made = []
        for group_key, group in ready.items():
            made.extend(self._form_group(group_key, group, now))
        return made

    def _waiting(self):
        """({group key: [item]} of waiting items whose job is deferred for them, [item ids]
        whose job has ended)."""
        rows = (
            AiProviderBatchItem.select(AiProviderBatchItem, AiJob.lifecycle_status, AiJob.locked_by)
            .join(AiJob, on=(AiJob.id == AiProviderBatchItem.job_id))
            .where(AiProviderBatchItem.state == WAITING)
            .where(
                (AiJob.lifecycle_status.in_(TERMINAL))
                | (
                    AiJob.locked_by.is_null()
                    & (AiJob.attempt_no == AiProviderBatchItem.parked_attempt)
                )
            )
            .order_by(AiProviderBatchItem.id)
            .limit(FORM_SCAN)
            .objects()
        )
        ready, gone = {}, []
        for item in rows:
            if item.lifecycle_status in TERMINAL:
                gone.append(item.id)
            else:
                ready.setdefault(item.group_key, []).append(item)
        return ready, gone

    def _cancel_items(self, item_ids):
        AiProviderBatchItem.update(state=CANCELLED, updated_at=self.store.now()).where(
            AiProviderBatchItem.id.in_(item_ids) & (AiProviderBatchItem.state == WAITING)
        ).execute()

    def _form_group(self, group_key, group, now):
        max_jobs = min(MAX_BATCH_JOBS, min(item.max_jobs for item in group))
        made = []
        while group:
            oldest_waited_ms = (now - group[0].created_at).total_seconds() * 1000
            due = len(group) >= max_jobs or oldest_waited_ms >= min(
                item.max_wait_ms for item in group
            )
            if not due:
                break
            chosen, group = group[:max_jobs], group[max_jobs:]
            batch_id = self.store.run_in_transaction(lambda tx, c=chosen: self._new(group_key, c))
            if batch_id is not None:
                made.append(batch_id)
        return made

    def _new(self, group_key, chosen):
        provider, model = group_key.split('/', 1)
        batch_id = new_id()
        now = self.store.now()
        changed = (
            AiProviderBatchItem.update(state=BATCHED, batch_id=batch_id, updated_at=now)
            .where(
                AiProviderBatchItem.id.in_([item.id for item in chosen])
                & (AiProviderBatchItem.state == WAITING)
            )
            .execute()
        )
        if not changed:  # a leader that lost its lease mid-step formed them already
            return None
        AiProviderBatch.insert(
            id=batch_id,
            provider=provider,
            model=model,
            state=BUILDING,
            job_count=changed,
            created_at=now,
            updated_at=now,
        ).execute()
        log_event('batch.formed', batch_id=batch_id, entry=group_key, jobs=changed)
        return batch_id

    # ---------------------------------------------------------------- upload and create
    def pending(self):
        """The batch rows not yet submitted (building or uploaded) and not waiting out a failed
        step's backoff, oldest first."""
        return list(
            AiProviderBatch.select()
            .where(AiProviderBatch.state.in_((BUILDING, UPLOADED)))
            .where(
                AiProviderBatch.next_poll_at.is_null()
                | (AiProviderBatch.next_poll_at <= self.store.now())
            )
            .order_by(AiProviderBatch.created_at)
        )

    def all_jobs_ended(self, batch):
        """Has every job of the row ended (cancelled, or finished otherwise)? Then there is
        nothing to upload or create."""
        return not (
            AiProviderBatchItem.select()
            .join(AiJob, on=(AiJob.id == AiProviderBatchItem.job_id))
            .where(
                (AiProviderBatchItem.batch_id == batch.id) & AiJob.lifecycle_status.not_in(TERMINAL)
            )
            .exists()
        )

    def upload(self, batch, leading=None):
        """building -> uploaded: the file of the row's items, unless a kill came after the
        provider stored it (then it is found by its name). ``leading()`` is asked right before
        the upload: a leader that lost its lease during the search leaves it to the next."""
        api = self.apis(batch.provider)
        filename = input_filename(batch.id)
        file_id = api.find_file(filename, listed_since(batch))
        if file_id is None:
            if leading is not None and not leading():
                return
            batch_items = (
                AiProviderBatchItem.select()
                .where(AiProviderBatchItem.batch_id == batch.id)
                .order_by(AiProviderBatchItem.id)
            )
            file_id = api.upload(filename, jsonl(batch_items))
        AiProviderBatch.update(
            state=UPLOADED, input_file_id=file_id, updated_at=self.store.now()
        ).where((AiProviderBatch.id == batch.id) & (AiProviderBatch.state == BUILDING)).execute()
        # What the row says now: a leader that lost its lease mid-step may have stored its file.
        stored = AiProviderBatch.get_by_id(batch.id)
        batch.state, batch.input_file_id = stored.state, stored.input_file_id

    def create(self, batch, leading=None):
        """uploaded -> submitted: the provider's batch, unless a kill came after the provider
        made it (then it is found by its metadata); with a ``batch_submitted`` row in each
        job's history, in the transaction that stores the provider's id. ``leading()`` is asked
        right before the create, as in ``upload``."""
        api = self.apis(batch.provider)
        created = api.find_batch(batch.id, listed_since(batch))
        if created is None:
            if leading is not None and not leading():
                return
            created = api.create(batch.input_file_id, batch.id)
        self.store.run_in_transaction(lambda tx: self._submitted(batch, created))
        batch.state = SUBMITTED
        log_event('batch.submitted', batch_id=batch.id, provider_batch_id=created['id'])

    def _submitted(self, batch, created):
        now = self.store.now()
        changed = (
            AiProviderBatch.update(
                state=SUBMITTED,
                provider_batch_id=created['id'],
                provider_status=created.get('status') or '',
                submitted_at=now,
                poll_count=0,  # failed submit steps may have counted: polls back off anew
                next_poll_at=self.store.now_plus_ms(self.poll_first_ms),
                updated_at=now,
            )
            .where((AiProviderBatch.id == batch.id) & (AiProviderBatch.state == UPLOADED))
            .execute()
        )
        if not changed:
            return
        job_ids = [
            item.job_id
            for item in AiProviderBatchItem.select(AiProviderBatchItem.job_id).where(
                AiProviderBatchItem.batch_id == batch.id
            )
        ]
        items.insert_history(self.store, BATCH_SUBMITTED, job_ids, {'batchId': batch.id})
