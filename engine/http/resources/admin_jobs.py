"""The admin job resource (SUPER_ADMIN): every user's jobs with their internal details, and the
retry of a failed or cancelled job as a new one; with their part of the OpenAPI document."""

from ...core.logs import log_event
from .. import params as listing
from .. import parsing, views
from ..openapi import (
    NULLABLE_TIME,
    TIME,
    error_responses,
    job_id_param,
    job_list_params,
    job_status_schema,
    json_response,
    ref,
)
from ..replies import reply


class AdminJobs:
    """GET /admin-api/ai/jobs and POST /admin-api/ai/jobs/{id}/retry."""

    def __init__(self, runtime, access):
        self.runtime = runtime
        self.access = access

    def routes(self):
        return (
            ('GET', '/admin-api/ai/jobs', self.admin_list_jobs, True),
            ('POST', '/admin-api/ai/jobs/<job_id>/retry', self.admin_retry_job, True),
        )

    def paths(self):
        return _paths()

    def schemas(self):
        job_status = job_status_schema()
        admin_job = dict(
            job_status,
            properties=dict(
                job_status['properties'],
                **{
                    'userId': {'type': 'string'},
                    'targetType': {'type': 'string'},
                    'targetId': {'type': 'string'},
                    'attemptNo': {'type': 'integer'},
                    'retryCount': {'type': 'integer'},
                    'maxRetryCount': {'type': 'integer'},
                    'internalErrorMessage': {
                        'type': ['string', 'null'],
                        'description': 'SUPER_ADMIN only (contracts §7.4).',
                    },
                    'retryOfJobId': {'type': ['string', 'null']},
                    'cancelRequestedAt': NULLABLE_TIME,
                    'updatedAt': TIME,
                },
            ),
            required=job_status['required'] + ['userId', 'internalErrorMessage'],
        )

        return {
            'AdminJob': admin_job,
            'AdminJobList': {
                'type': 'object',
                'additionalProperties': False,
                'required': ['items', 'nextCursor', 'limit'],
                'properties': {
                    'items': {'type': 'array', 'items': ref('AdminJob')},
                    'nextCursor': {
                        'type': ['string', 'null'],
                        'description': 'Pass as `cursor` for the next page; null on the last page.',
                    },
                    'limit': {'type': 'integer'},
                },
            },
        }

    def admin_list_jobs(self):
        self.access.admin()
        query = listing.parse_query(parsing.query(), strict=True)
        jobs, next_cursor = listing.list_jobs(query)
        refs = views.artifact_refs([job.id for job in jobs if job.lifecycle_status == 'succeeded'])
        items = [views.admin_job(job, refs.get(job.id, ())) for job in jobs]
        return reply({'items': items, 'nextCursor': next_cursor, 'limit': query.limit})

    def admin_retry_job(self, job_id):
        self.access.admin()
        job = self.runtime.service.retry_job(job_id)
        log_event(
            'job.retried',
            job_id=job.id,
            job_type=job.job_type,
            retry_of_job_id=job_id,
            status=job.lifecycle_status,
        )
        return reply(views.admin_job(job), 201, {'Location': '/api/ai/jobs/%s' % job.id})


def _paths():
    return {
        '/admin-api/ai/jobs': {
            'get': {
                'summary': 'List jobs, newest first (SUPER_ADMIN).',
                'parameters': job_list_params(user_filter=True),
                'responses': dict(
                    {'200': json_response('One page.', ref('AdminJobList'))},
                    **error_responses(400, 401, 403, 503),
                ),
            }
        },
        '/admin-api/ai/jobs/{jobId}/retry': {
            'post': {
                'summary': 'Retry a failed or cancelled job as a new job (SUPER_ADMIN).',
                'parameters': [job_id_param()],
                'responses': dict(
                    {'201': json_response('The new job, linked by retryOfJobId.', ref('AdminJob'))},
                    **error_responses(401, 403, 404, 409, 429, 503),
                ),
            }
        },
    }
