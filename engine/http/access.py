"""Who is calling and what they may see: the bearer token of the request as a principal (401
without one), SUPER_ADMIN for the admin API (403), and a job only for its owner or an admin
(404 otherwise, never 403, so that job ids of other users cannot even be confirmed)."""

import bottle

from ..core.errors import ForbiddenError, JobNotFoundError, UnauthorizedError
from . import views
from .auth import TokenStore, bearer_token
from .parsing import header


class Access:
    """The checks every resource makes of its caller, over the API tokens."""

    def __init__(self, store):
        self.tokens = TokenStore(store)

    def caller(self):
        token = bearer_token(header('Authorization'))
        principal = self.tokens.authenticate(token) if token else None
        if principal is None:
            raise UnauthorizedError()
        bottle.request.environ['aijob.principal'] = principal
        return principal

    def admin(self):
        principal = self.caller()
        if not principal.is_admin:
            raise ForbiddenError()
        return principal

    def visible_job(self, job_id, principal, admin_sees_all=True):
        return self.visible_status(job_id, principal, admin_sees_all)[0]

    def visible_status(self, job_id, principal, admin_sees_all=True):
        """(job, artifact references) if ``principal`` may see the job; otherwise JOB_NOT_FOUND."""
        job, refs = views.find_for_status(job_id)
        if job is None or not (
            job.user_id == principal.user_id or (admin_sees_all and principal.is_admin)
        ):
            raise JobNotFoundError(job_id)
        return job, refs
