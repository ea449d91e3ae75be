"""Who is calling and what they may see: the bearer credential of the request as a principal
(401 without a good one), SUPER_ADMIN for the admin API (403), and a job only for those who may
see it (404 otherwise, never 403, so that job ids of other users cannot even be confirmed).

Four kinds of credential, one ``Authorization: Bearer`` header (issue 33):

- an API token (auth.py): a user, a service, or SUPER_ADMIN;
- a JWT the application signed for its user (jwt_auth.py, with AIJOB_JWT_*): that user;
- a job's publicAccessToken (job_tokens.py): that one job, read, follow and cancel.

A user sees their own jobs; SUPER_ADMIN every job; a service every job (it acts for all the
application's users), but owns none and reaches only the job endpoints; a job token its job.
"""

import bottle

from ..core.errors import ForbiddenError, JobNotFoundError, UnauthorizedError
from . import views
from .auth import TOKEN_PATTERN, TokenStore
from .job_tokens import JobTokens, is_job_token
from .jwt_auth import JwtVerifier, looks_like_jwt
from .parsing import header

# Longer than any credential we accept (a JWT of a few claims is well under 2 KB).
MAX_CREDENTIAL_CHARS = 8192


class Access:
    """The checks every resource makes of its caller."""

    def __init__(self, runtime):
        config = runtime.config
        self.tokens = TokenStore(runtime.store)
        self.jwt = JwtVerifier(config)
        self.job_tokens = JobTokens(
            runtime.store, config.credential_master_key, config.public_token_ttl_s
        )

    def job_caller(self):
        """Anyone who may reach a job endpoint: a user, SUPER_ADMIN, a service, a job token.
        Which jobs they may see is ``visible_status``'s answer."""
        principal = self._principal()
        bottle.request.environ['aijob.principal'] = principal
        return principal

    def caller(self):
        """A user (token or JWT) or SUPER_ADMIN, acting for themselves: every endpoint that is
        not a job's. A service key or a job token here is 403."""
        principal = self.job_caller()
        if principal.is_service:
            raise ForbiddenError('A service key may only create, read, follow and cancel jobs.')
        if principal.is_job_token:
            raise ForbiddenError('A publicAccessToken may only read, follow and cancel its job.')
        return principal

    def creator(self):
        """Who may create a job: a user, SUPER_ADMIN, or a service (for one of its users)."""
        principal = self.job_caller()
        if principal.is_job_token:
            raise ForbiddenError('A publicAccessToken may only read, follow and cancel its job.')
        return principal

    def admin(self):
        principal = self.caller()
        if not principal.is_admin:
            raise ForbiddenError()
        return principal

    @staticmethod
    def wait_key(principal, job):
        """Whose per-user cap a wait on ``job`` counts against (a long poll, a stream): the
        job's user for a service key, which follows many users' jobs; the caller's otherwise."""
        return job.user_id if principal.is_service else principal.user_id

    def visible_job(self, job_id, principal, admin_sees_all=True):
        return self.visible_status(job_id, principal, admin_sees_all)[0]

    def visible_status(self, job_id, principal, admin_sees_all=True):
        """(job, artifact references) if ``principal`` may see the job; otherwise JOB_NOT_FOUND.
        A job token names its job: any other id is not found without a read."""
        if principal.is_job_token and principal.job_id != job_id:
            raise JobNotFoundError(job_id)
        job, refs = views.find_for_status(job_id)
        if job is None or not (
            job.user_id == principal.user_id
            or principal.is_service
            or (admin_sees_all and principal.is_admin)
        ):
            raise JobNotFoundError(job_id)
        return job, refs

    def _principal(self):
        credential = bearer_credential(header('Authorization'))
        if credential is None:
            raise UnauthorizedError()
        if is_job_token(credential):
            return self.job_tokens.principal(credential)
        if TOKEN_PATTERN.match(credential):
            principal = self.tokens.authenticate(credential)
            if principal is None:
                raise UnauthorizedError()
            return principal
        if self.jwt.enabled and looks_like_jwt(credential):
            return self.jwt.principal(credential)
        raise UnauthorizedError()


def bearer_credential(authorization_header):
    """The credential of an ``Authorization: Bearer …`` header, or None when missing or too long
    to be one of ours."""
    scheme, _, credential = (authorization_header or '').strip().partition(' ')
    credential = credential.strip()
    if scheme.lower() != 'bearer' or not credential or len(credential) > MAX_CREDENTIAL_CHARS:
        return None
    return credential
