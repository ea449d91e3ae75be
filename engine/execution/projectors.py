"""ResultProjector (contracts §6): writes a job's validated output where the application reads it,
in the same transaction that marks the job succeeded. The built-in projector keeps the whole output
as one JSON artifact."""

import hashlib
import uuid
from dataclasses import dataclass, field

from ..core.errors import MisconfiguredJobError
from ..core.models import AiArtifact, canonical_hash
from ..core.sql import insert_row


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


# Both inserts are idempotent (contracts §6.3): an artifact's id is derived from its job, type and
# ordinal, so projecting the same job again finds the same keys and writes nothing new.
INSERT_ARTIFACT = (
    'INSERT INTO ai_artifact (id, job_id, artifact_type, content, content_hash, created_at) VALUES '
)
INSERT_LINK = (
    'INSERT INTO ai_job_artifact (job_id, artifact_type, artifact_id, ordinal, created_at) VALUES '
)


def artifact_id(job_id, artifact_type, ordinal):
    """The id of a job's artifact of ``artifact_type`` at ``ordinal``: the job id's time prefix
    (so ids still sort by creation and insert at the B-tree's right edge), then 80 bits of a hash
    of the three."""
    digest = hashlib.sha256(('%s:%s:%d' % (job_id, artifact_type, ordinal)).encode()).digest()
    prefix = uuid.UUID(job_id).int >> 80
    raw = (prefix << 80) | int.from_bytes(digest[:10], 'big')
    raw = (raw & ~(0xF << 76)) | (0x7 << 76)  # version 7, as new_id()
    raw = (raw & ~(0x3 << 62)) | (0x2 << 62)
    return str(uuid.UUID(int=raw))


def link_artifact(tx, job, ref):
    """Record ``ref`` in ai_job_artifact; a duplicate is an idempotent success (contracts §6.3)."""
    params = (job.id, ref.artifact_type, ref.artifact_id, ref.ordinal)
    insert_row(INSERT_LINK, '(%s, %s, %s, %s, {now})', params, ignore_duplicate=True)
    return ref


def store_json_artifact(tx, job, artifact_type, content, ordinal=0):
    """Keep ``content`` as an ai_artifact row linked to the job; the same (job, type, ordinal)
    projected twice keeps the first row and returns the same reference."""
    ref = ArtifactRef(artifact_type, artifact_id(job.id, artifact_type, ordinal), ordinal)
    params = (
        ref.artifact_id,
        job.id,
        artifact_type,
        AiArtifact.content.db_value(content),
        canonical_hash(content),
    )
    insert_row(INSERT_ARTIFACT, '(%s, %s, %s, %s, %s, {now})', params, ignore_duplicate=True)
    return link_artifact(tx, job, ref)


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
