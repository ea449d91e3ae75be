"""The JSON shapes the API returns (contracts §7.2), built from store rows; camelCase, UTC ISO-8601
times, optional fields left out rather than null. No HTTP here."""

from peewee import JOIN

from ..core.models import AiArtifact, AiJobArtifact

# JobStatusResponse lives in core, so that a webhook (dispatch) delivers the very same body.
from ..core.status_view import STATUS_COLUMNS, find_for_status, iso, job_status  # noqa: F401


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


def status_body(job, refs=None):
    """JobStatusResponse; ``refs`` when the caller read them with the job already."""
    if refs is None and job.lifecycle_status == 'succeeded':
        refs = artifact_refs([job.id])[job.id]
    return job_status(job, refs or ())
