"""The body of ``POST /api/ai/jobs``: the checks of what a client sends (the fields it may set, the
idempotency key in the header or the body) and its schema in the OpenAPI document, one per job
type, so that a body the document allows is one the server accepts. The installed extensions'
own fields (core.extension.CreateField: a job's webhookUrl, say) come after the kernel's; without
the extension its field is unknown."""

from ...core.errors import InvalidRequestError
from ...core.registry import first_error
from ...core.service import CreateJobInput
from ..auth import USER_ID_PATTERN
from ..openapi import NOT_BLANK

CREATE_FIELDS = (
    'jobType',
    'targetType',
    'targetId',
    'input',
    'idempotencyKey',
    'overrides',
)
USER_KEY_MODE = 'user_deepseek_key'


# Only a service key sets it: the end user the job is created for (issue 33).
SERVICE_FIELDS = CREATE_FIELDS + ('userId',)


def create_request(principal, body, header_key, extra_fields=()):
    """A CreateJobInput from a POST body: fields a client may not set are refused, never
    honoured; the job belongs to the caller, or for a service key to the ``userId`` it names.
    ``extra_fields``: the extensions' CreateFields."""
    base = SERVICE_FIELDS if principal.is_service else CREATE_FIELDS
    allowed = base + tuple(extra.name for extra in extra_fields)
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequestError(
            '%s may not be set by a client (allowed: %s)' % (unknown[0], ', '.join(allowed)),
            field=unknown[0],
        )
    if not isinstance(body.get('jobType'), str) or not body['jobType']:
        raise InvalidRequestError('jobType is required and must be a string', field='jobType')
    body_key = body.get('idempotencyKey')
    if header_key is not None and body_key is not None and header_key != body_key:
        raise InvalidRequestError(
            'the Idempotency-Key header and idempotencyKey differ', field='idempotencyKey'
        )
    return CreateJobInput(
        user_id=_owner(principal, body),
        job_type=body['jobType'],
        target_type=body.get('targetType'),
        target_id=body.get('targetId'),
        input=body.get('input', {}),
        idempotency_key=header_key if header_key is not None else body_key,
        overrides=body.get('overrides') or {},
        extra={
            extra.name: body[extra.name]
            for extra in extra_fields
            if body.get(extra.name) is not None
        },
        created_by=principal.name if principal.is_service else None,
    )


def _owner(principal, body):
    """Whose job it is: the caller's, or the end user a service key names."""
    if not principal.is_service:
        return principal.user_id
    user_id = body.get('userId')
    if not isinstance(user_id, str) or not USER_ID_PATTERN.match(user_id):
        raise InvalidRequestError(
            'a service key creates a job for a user: userId (1-64 characters, no spaces)',
            field='userId',
        )
    return user_id


def create_job_schema(definitions, prompt_versions, extra_fields=()):
    """One schema per job type (``oneOf`` on ``jobType``): its input schema and the credential
    modes it allows are part of the contract, so a body the document allows is one the server
    accepts. Optional fields may be null (the same as absent)."""
    return {
        'oneOf': [_create_one(d, prompt_versions(d), extra_fields) for d in definitions],
        'description': 'Idempotency: idempotencyKey or the Idempotency-Key header; when both are '
        'given they must be equal.',
    }


def _create_one(definition, prompt_versions, extra_fields):
    text = {'type': 'string', 'pattern': NOT_BLANK}
    nullable = lambda schema: dict(schema, type=[schema['type'], 'null'])  # noqa: E731
    required = ['jobType', 'targetType', 'targetId']
    schema = definition.input.schema
    if schema is not None and first_error(schema, {}) is not None:
        required.append('input')  # the default {} would not do
    return {
        'type': 'object',
        'additionalProperties': False,
        'required': required,
        'properties': {
            'jobType': {'const': definition.job_type},
            'targetType': dict(text, maxLength=64),
            'targetId': dict(text, maxLength=128),
            'input': dict(
                definition.input.schema or {'type': 'object'},
                description="The job type's input (default {}).",
            ),
            'idempotencyKey': nullable(dict(text, maxLength=255)),
            'userId': {
                'type': 'string',
                'pattern': r'^\S{1,64}$',
                'description': 'Service keys only, and required for them: the end user the job '
                "is created for (it is that user's job in every respect). Anyone else: 400.",
            },
            **{extra.name: extra.schema for extra in extra_fields},
            'overrides': _overrides(definition, prompt_versions, text, nullable),
        },
    }


def _overrides(definition, prompt_versions, text, nullable):
    """What a job may override; ``credentialId`` names a stored key, and only with the
    user-key mode (which the job type must allow)."""
    modes = list(definition.credential.allowed_modes)
    schema = {
        'type': ['object', 'null'],
        'additionalProperties': False,
        'properties': {
            'priority': {'type': ['integer', 'null'], 'minimum': 0, 'maximum': 100},
            'credentialMode': {'enum': modes + [None]},
            'credentialId': {'type': 'null'},
            'promptVersion': nullable(dict(text, maxLength=32))
            if prompt_versions is None
            else {'enum': prompt_versions + [None]},
            'outputSchemaVersion': nullable(dict(text, maxLength=32)),
            'noCache': {
                'type': ['boolean', 'null'],
                'description': 'true: the response cache (a job type that opts in) is neither '
                'read nor written for this job.',
            },
        },
    }
    if USER_KEY_MODE in modes:
        user_mode = {'properties': {'credentialMode': {'const': USER_KEY_MODE}}}
        if definition.credential.default_mode != USER_KEY_MODE:
            user_mode['required'] = ['credentialMode']
        schema['if'] = user_mode
        schema['then'] = {
            'required': ['credentialId'],
            'properties': {'credentialId': dict(text, maxLength=36)},
        }
        schema['else'] = {'properties': {'credentialId': {'type': 'null'}}}
        schema['properties']['credentialId'] = {'type': ['string', 'null']}
    return schema
