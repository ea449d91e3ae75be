"""JobStatusResponse (contracts §7.2) built from the job's row: what GET /api/ai/jobs/{id}
answers, and the body a webhook delivers (architecture decision 15), so the two never differ."""

from typing import NamedTuple

from .models import AiJob
from .sql import Statement, execute, job_from_row
from .states import RUNNING, SUCCEEDED

# What JobStatusResponse and the ownership check read: status polling is the hot path, and
# building fewer columns into the row costs measurably less than the whole row.
STATUS_COLUMNS = (
    AiJob.id,
    AiJob.user_id,
    AiJob.job_type,
    AiJob.lifecycle_status,
    AiJob.queue_name,
    AiJob.priority,
    AiJob.progress,
    AiJob.created_at,
    AiJob.started_at,
    AiJob.finished_at,
    AiJob.error_code,
    AiJob.public_error_message,
    AiJob.locked_by,  # None on a running job: deferred, perhaps parked in a provider batch
)


SELECT_STATUS = Statement(
    'SELECT %s FROM ai_job WHERE id = %%s' % ', '.join(c.name for c in STATUS_COLUMNS)
)
# A succeeded job's artifact references, then the provider and model of the call that produced
# its result (its usage row without an error), in one read.
SELECT_ARTIFACT_REFS = Statement(
    'SELECT 0, ordinal, id, artifact_type, artifact_id FROM ai_job_artifact WHERE job_id = %s '
    'UNION ALL SELECT 1, 0, id, provider, model FROM ai_usage_log '
    'WHERE job_id = %s AND error_code IS NULL ORDER BY 1, 2, 3'
)
# The provider batch a deferred job's call is in (issue 22): read only for a running job that
# no worker holds, so polling a job that runs costs nothing more.
SELECT_BATCH_ID = Statement(
    "SELECT batch_id FROM ai_provider_batch_item WHERE job_id = %s AND state = 'batched' "
    'ORDER BY id DESC LIMIT 1'
)
_STATUS_NAMES = tuple(c.name for c in STATUS_COLUMNS)


class ArtifactLink(NamedTuple):
    artifact_type: str
    artifact_id: str


class ResultRefs(tuple):
    """A succeeded job's ArtifactLinks in ordinal order, with the provider and model that
    produced its result (None when no usage row names them)."""

    provider = None
    model = None


class _SucceededRefs:
    """The artifact references of succeeded jobs this process has read. A job's links are
    written in the transaction that marks it succeeded and never change after (a retry is a new
    job), so a succeeded job polled again costs one read, not two. Bounded: when full it starts
    over rather than track recency on the hot path."""

    LIMIT = 10000

    def __init__(self):
        self._refs = {}

    def get(self, job_id):
        refs = self._refs.get(job_id)
        if refs is None:
            rows = execute(SELECT_ARTIFACT_REFS, (job_id, job_id)).fetchall()
            refs = ResultRefs(ArtifactLink(*row[3:]) for row in rows if row[0] == 0)
            for row in rows:  # the last successful call's row, should a zombie's precede it
                if row[0] == 1:
                    refs.provider, refs.model = row[3], row[4]
            if len(self._refs) >= self.LIMIT:
                self._refs = {}
            self._refs[job_id] = refs
        return refs


SUCCEEDED_REFS = _SucceededRefs()


def find_for_status(job_id):
    """(job with STATUS_COLUMNS only, its artifact references in ordinal order), or (None, ()).
    One read of the job's row; the references only for a succeeded job (no other has any), and
    only the first time this process sees it succeeded; a deferred job's provider batch."""
    row = execute(SELECT_STATUS, (job_id,)).fetchone()
    if row is None:
        return None, ()
    job = job_from_row(_STATUS_NAMES, row)
    refs = SUCCEEDED_REFS.get(job_id) if job.lifecycle_status == SUCCEEDED else ()
    if job.lifecycle_status == RUNNING and job.locked_by is None:
        batch = execute(SELECT_BATCH_ID, (job_id,)).fetchone()
        job.batch_id = batch[0] if batch else None
    return job, refs


def iso(value):
    """A naive UTC datetime as ``2026-06-20T12:34:56.789Z`` (None stays None)."""
    if value is None:
        return None
    return value.isoformat(timespec='milliseconds') + 'Z'


def job_status(job, artifact_refs=()):
    """JobStatusResponse (contracts §7.2, frozen): exactly these keys, optional ones only when set.
    ``artifact_refs`` are the job's ai_job_artifact rows in ordinal order."""
    body = {
        'jobId': job.id,
        'jobType': job.job_type,
        'lifecycleStatus': job.lifecycle_status,
        'queueName': job.queue_name,
        'priority': job.priority,
        'progress': job.progress,
        'createdAt': iso(job.created_at),
    }
    optional = (
        ('startedAt', iso(job.started_at)),
        ('finishedAt', iso(job.finished_at)),
        ('errorCode', job.error_code),
        ('publicErrorMessage', job.public_error_message),
        ('batchId', getattr(job, 'batch_id', None)),  # set by find_for_status
    )
    body.update((name, value) for name, value in optional if value is not None)
    if job.lifecycle_status == SUCCEEDED:
        refs = [
            {'artifactType': ref.artifact_type, 'artifactId': ref.artifact_id}
            for ref in artifact_refs
        ]
        body['result'] = {'artifactCount': len(refs), 'artifacts': refs}
        model = getattr(artifact_refs, 'model', None)
        if model:  # the provider and model that produced the result (a fallback shows here)
            body['result'].update(provider=artifact_refs.provider, model=model)
    return body
