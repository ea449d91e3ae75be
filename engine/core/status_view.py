"""JobStatusResponse (contracts §7.2) built from the job's row: what GET /api/ai/jobs/{id}
answers, and the body a webhook delivers (architecture decision 15), so the two never differ."""

from typing import NamedTuple

from .lifecycle import SUCCEEDED
from .models import AiJob
from .sql import Statement, execute, job_from_row

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
)


# The job and its artifact references in one round trip (links exist only for a succeeded job).
SELECT_STATUS = Statement(
    'SELECT %s, a.artifact_type, a.artifact_id FROM ai_job j '
    'LEFT JOIN ai_job_artifact a ON a.job_id = j.id '
    'WHERE j.id = %%s ORDER BY a.ordinal, a.id' % ', '.join('j.' + c.name for c in STATUS_COLUMNS)
)
_STATUS_NAMES = tuple(c.name for c in STATUS_COLUMNS)


class ArtifactLink(NamedTuple):
    artifact_type: str
    artifact_id: str


def find_for_status(job_id):
    """(job with STATUS_COLUMNS only, its artifact references in ordinal order), or (None, ())."""
    rows = execute(SELECT_STATUS, (job_id,)).fetchall()
    if not rows:
        return None, ()
    job = job_from_row(_STATUS_NAMES, rows[0][: len(_STATUS_NAMES)])
    refs = tuple(ArtifactLink(row[-2], row[-1]) for row in rows if row[-1] is not None)
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
    )
    body.update((name, value) for name, value in optional if value is not None)
    if job.lifecycle_status == SUCCEEDED:
        refs = [
            {'artifactType': ref.artifact_type, 'artifactId': ref.artifact_id}
            for ref in artifact_refs
        ]
        body['result'] = {'artifactCount': len(refs), 'artifacts': refs}
    return body
