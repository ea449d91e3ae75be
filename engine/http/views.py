"""The JSON shapes the API returns (contracts §7.2), built from store rows; camelCase, UTC ISO-8601
times, optional fields left out rather than null. No HTTP here."""

from typing import NamedTuple

from peewee import JOIN

from ..core.lifecycle import SUCCEEDED
from ..core.models import AiArtifact, AiJob, AiJobArtifact
from ..core.sql import Statement, execute, job_from_row

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


def admin_job(job, artifact_refs=()):
    """An admin list item: the JobStatusResponse plus who, what and the internal details that
    only a SUPER_ADMIN may see (contracts §7.4)."""
    body = job_status(job, artifact_refs)
    body.update(
        {
            'userId': job.user_id,
            'targetType': job.target_type,
            'targetId': job.target_id,
            'attemptNo': job.attempt_no,
            'retryCount': job.retry_count,
            'maxRetryCount': job.max_retry_count,
            'internalErrorMessage': job.internal_error_message,
            'retryOfJobId': job.retry_of_job_id,
            'cancelRequestedAt': iso(job.cancel_requested_at),
            'updatedAt': iso(job.updated_at),
        }
    )
    return body


def artifact_refs(job_ids):
    """ai_job_artifact rows of several jobs, in one query: {job_id: [row, …]} by ordinal."""
    refs = {job_id: [] for job_id in job_ids}
    if job_ids:
        query = (
            AiJobArtifact.select(
                AiJobArtifact.job_id, AiJobArtifact.artifact_type, AiJobArtifact.artifact_id
            )
            .where(AiJobArtifact.job_id.in_(list(job_ids)))
            .order_by(AiJobArtifact.job_id, AiJobArtifact.ordinal, AiJobArtifact.id)
            .namedtuples()
        )
        for ref in query:
            refs[ref.job_id].append(ref)
    return refs


def artifact_contents(job):
    """GET …/artifacts: each linked artifact with its content when the built-in projector kept
    it in ai_artifact (a business projector's own rows have no content here: null)."""
    query = (
        AiJobArtifact.select(AiJobArtifact, AiArtifact)
        .join(
            AiArtifact,
            JOIN.LEFT_OUTER,
            on=(AiArtifact.id == AiJobArtifact.artifact_id),
            attr='artifact',
        )
        .where(AiJobArtifact.job_id == job.id)
        .order_by(AiJobArtifact.ordinal, AiJobArtifact.id)
    )
    items = []
    for ref in query:
        artifact = getattr(ref, 'artifact', None)
        items.append(
            {
                'artifactType': ref.artifact_type,
                'artifactId': ref.artifact_id,
                'ordinal': ref.ordinal,
                'content': artifact.content if artifact is not None else None,
            }
        )
    return {'jobId': job.id, 'lifecycleStatus': job.lifecycle_status, 'artifacts': items}


def credential(info):
    """A stored provider key as its owner may see it: the mask, never the key."""
    return {
        'credentialId': info.id,
        'provider': info.provider,
        'maskedKey': info.masked_key,
        'createdAt': iso(info.created_at),
    }
