"""Admission: may this user create this job now? Checked by AiJobService before anything is
written (ADR §7.3: TOO_MANY_JOBS, QUOTA_EXCEEDED, PLATFORM_UNAVAILABLE).

The counts are read outside the creating transaction, so two requests racing at the very edge of a
limit may both pass; a limit is a guard against runaway clients, not an exact budget.
"""
import datetime

from .errors import QuotaExceededError, TooManyJobsError
from .lifecycle import QUEUED, RUNNING
from .store import AiJob, db_today


class Admission:
    """``admission(request, definition)``: raises a 429/503 AiJobError, or returns None."""

    def __init__(self, store, ai, *, max_active_per_user, daily_quota):
        self.store = store
        self.ai = ai
        self.max_active_per_user = max_active_per_user      # 0: no limit
        self.daily_quota = daily_quota                      # 0: no limit

    @classmethod
    def from_config(cls, config, store, ai):
        return cls(store, ai, max_active_per_user=config.max_active_jobs_per_user,
                   daily_quota=config.daily_job_quota)

    def __call__(self, request, definition):
        self.ai.check_creatable(definition, request.overrides or {})
        self._check_active(request.user_id)
        self._check_daily_quota(request.user_id)

    def _check_active(self, user_id):
        if not self.max_active_per_user:
            return
        active = AiJob.select().where(
            (AiJob.user_id == user_id)
            & AiJob.lifecycle_status.in_((QUEUED, RUNNING))).count()
        if active >= self.max_active_per_user:
            raise TooManyJobsError('user has %d unfinished jobs (limit %d)'
                                   % (active, self.max_active_per_user))

    def _check_daily_quota(self, user_id):
        if not self.daily_quota:
            return
        created_today = AiJob.select().where(       # the database's UTC day (DESIGN decision 2)
            (AiJob.user_id == user_id) & (AiJob.created_at >= db_today())).count()
        if created_today >= self.daily_quota:
            now = self.store.clock()
            next_day = now.replace(hour=0, minute=0, second=0, microsecond=0) \
                + datetime.timedelta(days=1)
            raise QuotaExceededError(retry_after_s=max(1, int((next_day - now).total_seconds())))
