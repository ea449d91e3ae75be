"""The job resource (contracts §7): create, read (with the long poll), list, artifacts, history
and cancel of the caller's own jobs, and their part of the OpenAPI document."""

import hashlib
import time

import bottle

from ...core import history
from ...core.errors import (
    InvalidRequestError,
    JobNotFoundError,
    UnknownJobTypeError,
)
from ...core.logs import log_event
from ...core.states import RUNNING, TERMINAL
from .. import history_view, parsing, views
from .. import params as listing
from ..openapi import (
    STATUSES,
    TIME,
    error_responses,
    job_id_param,
    job_list_params,
    job_status_schema,
    json_response,
    query_param,
    ref,
)
from ..replies import encode, reply
from ..waiter import GONE_CHECK_S, Watch, client_gone
from .job_request import create_job_schema, create_request

MAX_WAIT_MS = 30_000


class Jobs:
    """The caller's own jobs under /api/ai/jobs, with the long poll's watch."""

    def __init__(self, runtime, access):
        self.runtime = runtime
        self.store = runtime.store
        self.access = access
        self.max_body_bytes = runtime.config.max_body_bytes
        # The ?waitMs= requests of this process; the server ends their waits when it stops.
        self.watch = Watch(
            runtime.store,
            runtime.config.status_wait_poll_ms / 1000.0,
            runtime.config.max_waiters,
            runtime.config.max_waiters_per_user,
        )

    def routes(self):
        return (
            ('POST', '/api/ai/jobs', self.create_job, True),
            ('GET', '/api/ai/jobs', self.list_jobs, True),
            ('GET', '/api/ai/jobs/<job_id>', self.get_job, False),  # takes its own connections
            ('GET', '/api/ai/jobs/<job_id>/artifacts', self.get_artifacts, True),
            ('GET', '/api/ai/jobs/<job_id>/events', self.get_events, True),
            ('POST', '/api/ai/jobs/<job_id>/cancel', self.cancel_job, True),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        registry = self.runtime.registry
        definitions = sorted(
            (d for d in registry.get_all() if d.api_creatable), key=lambda d: d.job_type
        )
        prompt_versions = self.runtime.ai.prompt_versions or (lambda definition: None)
        return {
            'CreateJobRequest': create_job_schema(
                definitions, prompt_versions, self.runtime.hooks.create_fields
            ),
            'CreatedJob': created_job_schema(),
            'JobEvent': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['id', 'jobId', 'kind', 'attemptNo', 'detail', 'at'],
                'properties': {
                    'id': {
                        'type': 'integer',
                        'description': 'Increases across all jobs: page and resume after it.',
                    },
                    'jobId': {'type': 'string'},
                    'kind': {
                        'enum': list(history.KINDS),
                        'description': 'README "Job history". `deferred`: a guard (a provider rate '
                        'limit, a budget that waits) handed the job back, still running with no '
                        'worker, until its wake time (detail: reason, delayMs); no retry spent.',
                    },
                    'attemptNo': {
                        'type': 'integer',
                        'minimum': 0,
                        'description': "The job's lock count when it happened (0: never locked).",
                    },
                    'detail': {
                        'type': 'object',
                        'description': 'Per kind (README "Job history"). worker, dispatcher, '
                        'internalMessage: SUPER_ADMIN only.',
                    },
                    'at': TIME,
                },
            },
            'JobEventList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['jobId', 'lifecycleStatus', 'events', 'nextAfter'],
                'properties': {
                    'jobId': {'type': 'string'},
                    'lifecycleStatus': {'enum': STATUSES},
                    'events': {'type': 'array', 'items': ref('JobEvent')},
                    'nextAfter': {
                        'type': ['integer', 'null'],
                        'description': 'The last event id when more may follow (pass it as after).',
                    },
                },
            },
            'ArtifactList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['jobId', 'lifecycleStatus', 'artifacts'],
                'properties': {
                    'jobId': {'type': 'string'},
                    'lifecycleStatus': {'enum': STATUSES},
                    'artifacts': {
                        'type': 'array',
                        'items': {
                            'type': 'object',
                            'additionalProperties': False,
                            'required': ['artifactType', 'artifactId', 'ordinal', 'content'],
                            'properties': {
                                'artifactType': {'type': 'string'},
                                'artifactId': {'type': 'string'},
                                'ordinal': {'type': 'integer'},
                                'content': {
                                    'description': 'The artifact JSON; null when a '
                                    'business projector keeps it elsewhere.'
                                },
                            },
                        },
                    },
                },
            },
            'JobList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['items', 'nextCursor', 'limit'],
                'properties': {
                    'items': {'type': 'array', 'items': ref('JobStatusResponse')},
                    'nextCursor': {
                        'type': ['string', 'null'],
                        'description': 'Pass as `cursor` for the next page; null on the last page.',
                    },
                    'limit': {'type': 'integer'},
                },
            },
        }

    def create_job(self):
        principal = self.access.creator()
        body = parsing.json_object(self.max_body_bytes)
        request = create_request(
            principal, body, parsing.idempotency_key(), self.runtime.hooks.create_fields
        )
        if not self.runtime.registry.get(request.job_type).api_creatable:
            raise UnknownJobTypeError(request.job_type)  # internal-only types stay unlisted
        result = self.runtime.service.create_job(request)
        job = result.job
        if result.created:
            log_event(
                'job.created',
                job_id=job.id,
                job_type=job.job_type,
                status=job.lifecycle_status,
                user_id=job.user_id,
                queue=job.queue_name,
                service=principal.name,
            )
        body = dict(views.status_body(job), publicAccessToken=self.access.job_tokens.issue(job))
        return reply(
            body,
            201 if result.created else 200,
            {'Location': '/api/ai/jobs/%s' % job.id},
        )

    def get_job(self, job_id):
        """The job's status; with ``waitMs`` it first waits for a change. The route holds no
        database connection of its own (``db=False``): one unit of work reads, and a wait takes
        one only for each re-read."""
        with self.store.connection():
            principal = self.access.job_caller()
            wait_ms, known = requested_wait_ms(), parsing.if_none_match()
            job, refs = self.access.visible_status(job_id, principal)
            body, etag, data = self.status_with_etag(job, refs)
        if wait_ms and etag in (known or {etag}) and body['lifecycleStatus'] not in TERMINAL:
            waiter = self.watch.enter(job_id, self.access.wait_key(principal, job))
            try:
                body, etag, data = self.wait_for_change(waiter, body, etag, data, known, wait_ms)
            finally:
                self.watch.leave(waiter)
        if etag in known:
            return bottle.HTTPResponse(
                status=304, headers={'ETag': etag, 'Cache-Control': 'no-cache'}
            )
        return reply(data, 200, {'ETag': etag, 'Cache-Control': 'no-cache'})

    def wait_for_change(self, waiter, body, etag, data, known, wait_ms):
        """Wait until the job differs from what the client has (its If-None-Match, else what it
        would have got now), it is terminal, time is up, or the client has gone away (then the
        wait stops at once: nothing is read for nobody). The watch wakes the waiter when the
        job's row changed; only then does it read the whole status again."""
        baseline = known or {etag}
        deadline = time.monotonic() + wait_ms / 1000.0
        environ = bottle.request.environ
        while etag in baseline and body['lifecycleStatus'] not in TERMINAL:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            woken = waiter.changed.wait(min(GONE_CHECK_S, remaining))
            if client_gone(environ):
                log_event('http.wait_abandoned', job_id=waiter.job_id, user_id=waiter.user_id)
                break
            if self.watch.stopping():
                break
            if not woken:
                continue
            waiter.changed.clear()
            with self.store.connection():
                job, refs = views.find_for_status(waiter.job_id)
            if job is None:
                raise JobNotFoundError(waiter.job_id)
            body, etag, data = self.status_with_etag(job, refs)
        return body, etag, data

    def status_with_etag(self, job, refs):
        """(body, ETag, encoded body): the tag is a digest of the bytes sent, which job_status
        builds in a fixed key order, so the same status always has the same tag."""
        body = views.status_body(job, refs)
        data = encode(body)
        return body, '"%s"' % hashlib.sha256(data).hexdigest()[:32], data

    def get_artifacts(self, job_id):
        job = self.access.visible_job(job_id, self.access.job_caller())
        return reply(views.artifact_contents(job))

    def get_events(self, job_id):
        """The job's transition history (architecture decision 14), oldest first: the owner's
        view (no worker ids, no internal messages), or everything for SUPER_ADMIN."""
        principal = self.access.job_caller()
        job = self.access.visible_job(job_id, principal)
        after, limit = history_view.parse_query(parsing.query())
        body = history_view.job_events(self.store, job, after, limit, full=principal.is_admin)
        return reply(body)

    def cancel_job(self, job_id):
        principal = self.access.job_caller()
        job = self.access.visible_job(job_id, principal, admin_sees_all=False)
        job = self.runtime.service.cancel_job(job.id)
        log_event('job.cancel', job_id=job.id, job_type=job.job_type, status=job.lifecycle_status)
        # One rule (contracts §5.4): the code follows the status the answer carries. A job no
        # worker holds (queued, deferred, parked in a batch) is cancelled now: 200; one a worker
        # holds is still running until the engine stops it: 202.
        return reply(views.status_body(job), 202 if job.lifecycle_status == RUNNING else 200)

    def list_jobs(self):
        """The caller's own jobs, newest first: the admin list's filters and cursor, always
        restricted to the caller (a userId filter is refused, not honoured). A service lists
        one user's jobs: ``userId`` is required."""
        principal = self.access.creator()
        params = parsing.query()
        if principal.is_service:
            if 'userId' not in params:
                raise InvalidRequestError('a service key lists one user: userId', field='userId')
            user_id = params['userId']
        elif 'userId' in params:
            raise InvalidRequestError('userId is for the admin list only', field='userId')
        else:
            user_id = principal.user_id
        query = listing.parse_query(dict(params, userId=user_id), strict=True)
        jobs, next_cursor = listing.list_jobs(query)
        refs = views.artifact_refs([job.id for job in jobs if job.lifecycle_status == 'succeeded'])
        items = [views.job_status(job, refs.get(job.id, ())) for job in jobs]
        return reply({'items': items, 'nextCursor': next_cursor, 'limit': query.limit})


def created_job_schema():
    """A create's answer: the job's status and its publicAccessToken."""
    schema = job_status_schema()
    schema['required'] = schema['required'] + ['publicAccessToken']
    schema['properties']['publicAccessToken'] = {
        'type': 'string',
        'description': 'A bearer token for this job only (read, poll, stream, cancel where the '
        'job type allows it), for a browser; expires after AIJOB_PUBLIC_TOKEN_TTL_S.',
    }
    return schema


def requested_wait_ms():
    raw = bottle.request.query.get('waitMs')
    if raw is None:
        return 0
    wait_ms = listing.whole_number(raw, 0, MAX_WAIT_MS)
    if wait_ms is None:
        raise InvalidRequestError(
            'waitMs must be a whole number 0..%d' % MAX_WAIT_MS, field='waitMs'
        )
    return wait_ms


def _paths():
    job_id = job_id_param()
    return {
        '/api/ai/jobs': {
            'get': {
                'summary': "The caller's own jobs, newest first (the admin list's filters). "
                "A service key lists one user's: userId is required for it, refused for "
                'anyone else.',
                'parameters': job_list_params(user_filter=True),
                'responses': dict(
                    {'200': json_response('One page.', ref('JobList'))},
                    **error_responses(400, 401, 403, 503),
                ),
            },
            'post': {
                'summary': 'Create a job for the caller, or with a service key for the user '
                'its userId names (idempotent with a key).',
                'description': 'The answer carries a publicAccessToken: good for '
                'AIJOB_PUBLIC_TOKEN_TTL_S to read, poll, stream and (if the job type allows it) '
                'cancel this one job, e.g. from a browser.',
                'parameters': [
                    {
                        'name': 'Idempotency-Key',
                        'in': 'header',
                        'required': False,
                        'schema': {'type': 'string', 'maxLength': 255},
                    }
                ],
                'requestBody': {
                    'required': True,
                    'content': {'application/json': {'schema': ref('CreateJobRequest')}},
                },
                'responses': dict(
                    {
                        '201': json_response('Created.', ref('CreatedJob')),
                        '200': json_response(
                            'Idempotent replay: the job created earlier with this key.',
                            ref('CreatedJob'),
                        ),
                    },
                    **error_responses(400, 401, 403, 408, 413, 415, 422, 429, 503),
                ),
            },
        },
        '/api/ai/jobs/{jobId}': {
            'get': {
                'summary': 'Job status (owner, its publicAccessToken, a service key or '
                'SUPER_ADMIN). Poll with If-None-Match and waitMs.',
                'parameters': [
                    job_id,
                    query_param(
                        'waitMs',
                        'Wait up to this long (max 30000) for the job to change from what '
                        'If-None-Match names (or from its state now); answers at once when it '
                        'does.',
                        {'type': 'integer', 'minimum': 0, 'maximum': 30000},
                    ),
                    {
                        'name': 'If-None-Match',
                        'in': 'header',
                        'required': False,
                        'schema': {'type': 'string'},
                    },
                ],
                'responses': dict(
                    {
                        '200': json_response(
                            'The job.',
                            ref('JobStatusResponse'),
                            {'ETag': {'schema': {'type': 'string'}}},
                        ),
                        '304': {'description': 'Unchanged since the ETag in If-None-Match.'},
                    },
                    **error_responses(400, 401, 404, 429, 503),
                ),
            }
        },
        '/api/ai/jobs/{jobId}/artifacts': {
            'get': {
                'summary': 'The artifact contents of a job, in ordinal order (owner, its '
                'publicAccessToken, a service key or SUPER_ADMIN).',
                'parameters': [job_id],
                'responses': dict(
                    {'200': json_response('The artifacts.', ref('ArtifactList'))},
                    **error_responses(401, 404, 503),
                ),
            }
        },
        '/api/ai/jobs/{jobId}/events': {
            'get': {
                'summary': "The job's transition history, oldest first (owner, its "
                'publicAccessToken, a service key: public view; SUPER_ADMIN: everything).',
                'parameters': [
                    job_id,
                    query_param(
                        'after',
                        'Only events with a greater id.',
                        {'type': 'integer', 'minimum': 0, 'maximum': history_view.MAX_AFTER},
                    ),
                    query_param(
                        'limit',
                        'At most this many events (default %d).' % history_view.DEFAULT_LIMIT,
                        {'type': 'integer', 'minimum': 1, 'maximum': history_view.MAX_LIMIT},
                    ),
                ],
                'responses': dict(
                    {'200': json_response('The events.', ref('JobEventList'))},
                    **error_responses(400, 401, 404, 503),
                ),
            }
        },
        '/api/ai/jobs/{jobId}/cancel': {
            'post': {
                'summary': 'Cancel a job (owner, its publicAccessToken or a service key).',
                'parameters': [job_id],
                'responses': dict(
                    {
                        '200': json_response(
                            'Cancelled at once, lifecycleStatus cancelled (it was queued, or '
                            'running with no worker holding it: deferred, or parked in a '
                            'provider batch).',
                            ref('JobStatusResponse'),
                        ),
                        '202': json_response(
                            'Cancel requested, lifecycleStatus running: a worker holds the job '
                            'and stops it shortly.',
                            ref('JobStatusResponse'),
                        ),
                    },
                    **error_responses(401, 404, 409, 503),
                ),
            }
        },
    }
