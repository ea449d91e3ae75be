"""ResultProjector (contracts §6): writes a job's validated output where the application reads it,
in the same transaction that marks the job succeeded. The built-in projector keeps the whole output
as one JSON artifact."""

from dataclasses import dataclass, field

from ..core.errors import MisconfiguredJobError
from ..core.models import AiArtifact, AiJobArtifact, canonical_hash, new_id
from ..core.store import db_now


@dataclass(frozen=True)
class ArtifactRef:
    artifact_type: str
    artifact_id: str
    ordinal: int = 0


@dataclass
class ProjectionResult:
    artifacts: list = field(default_factory=list)  # of ArtifactRef


class ResultProjector:
    """``project`` runs inside the transaction ``tx`` (contracts §6.2) and must be idempotent: a
    second projection of the same job returns the existing references (contracts §6.3)."""

    key = None

    def project(self, tx, job, validated_output):
        raise NotImplementedError


def link_artifact(tx, job, ref):
    """Record ``ref`` in ai_job_artifact; a duplicate is an idempotent success (contracts §6.3), so
    the insert ignores a unique conflict instead of failing the transaction."""
    AiJobArtifact.insert(
        job_id=job.id,
        artifact_type=ref.artifact_type,
        artifact_id=ref.artifact_id,
        ordinal=ref.ordinal,
        created_at=db_now(),
    ).on_conflict_ignore().execute()
    return ref


def store_json_artifact(tx, job, artifact_type, content, ordinal=0):
    """Keep ``content`` as an ai_artifact row linked to the job; the same (job, type, ordinal)
    projected twice yields the first row."""
    existing = (
        AiJobArtifact.select()
        .where(
            (AiJobArtifact.job_id == job.id)
            & (AiJobArtifact.artifact_type == artifact_type)
            & (AiJobArtifact.ordinal == ordinal)
        )
        .first()
    )
    if existing is not None:
        return ArtifactRef(artifact_type, existing.artifact_id, ordinal)
    artifact_id = new_id()
    AiArtifact.insert(
        id=artifact_id,
        job_id=job.id,
        artifact_type=artifact_type,
        content=content,
        content_hash=canonical_hash(content),
        created_at=db_now(),
    ).execute()
    return link_artifact(tx, job, ArtifactRef(artifact_type, artifact_id, ordinal))


class JsonArtifactProjector(ResultProjector):
    """The default: the validated output, whole, as one ``json`` artifact."""

    key = 'json_artifact'

    def project(self, tx, job, validated_output):
        return ProjectionResult([store_json_artifact(tx, job, 'json', validated_output)])


class ProjectorRegistry:
    def __init__(self, projectors=()):
        self._projectors = {}
        for projector in (JsonArtifactProjector(),) + tuple(projectors):
            self.add(projector)

    def add(self, projector):
        self._projectors[projector.key] = projector

    def for_definition(self, definition):
        key = definition.projector or JsonArtifactProjector.key
        try:
            return self._projectors[key]
        except KeyError:
            raise MisconfiguredJobError(
                'no projector %r registered' % key, code='INTERNAL_PROJECTOR_MISSING'
            ) from None
