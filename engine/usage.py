"""AiUsageLogService: one ``ai_usage_log`` row per provider call (failed calls included), and the
admin totals per user or per job type over a time range."""
from decimal import Decimal

from peewee import fn

from .pricing import COST_PLACES
from .store import AiUsageLog, db_now

GROUPS = {'user': ('userId', AiUsageLog.user_id), 'job_type': ('jobType', AiUsageLog.job_type)}


def record_usage(job, attempt_no, provider, model, usage, cost, latency_ms, error_code=None):
    """Write the row for one provider call of ``job``; ``usage`` is a providers.Usage. Runs on
    the caller's connection, inside its transaction if it has one (the engine writes the row
    of a successful call in the PROJECT transaction)."""
    AiUsageLog.insert(
        job_id=job.id, user_id=job.user_id, job_type=job.job_type, attempt_no=attempt_no,
        credential_mode=job.credential_mode, provider=provider, model=model or '',
        prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
        cost=cost, latency_ms=int(latency_ms), error_code=error_code,
        created_at=db_now()).execute()


def usage_totals(since, until, group_by='user'):
    """Totals of calls in [since, until) (naive UTC datetimes) per user or per job type:
    ``[{"userId"|"jobType", calls, promptTokens, completionTokens, cost, errors}]``, the
    costliest first; ``cost`` is a decimal string."""
    if group_by not in GROUPS:
        raise ValueError('group_by must be one of %s' % ', '.join(GROUPS))
    name, column = GROUPS[group_by]
    query = (AiUsageLog
             .select(column.alias('group_key'),
                     fn.COUNT(AiUsageLog.id).alias('calls'),
                     fn.SUM(AiUsageLog.prompt_tokens).alias('prompt_tokens'),
                     fn.SUM(AiUsageLog.completion_tokens).alias('completion_tokens'),
                     fn.SUM(AiUsageLog.cost).alias('cost'),
                     fn.COUNT(AiUsageLog.error_code).alias('errors'))
             .where((AiUsageLog.created_at >= since) & (AiUsageLog.created_at < until))
             .group_by(column)
             .dicts())
    rows = [_total(name, row) for row in query]
    return sorted(rows, key=lambda r: (-Decimal(r['cost']), r[name]))


def _total(name, row):
    # SQLite sums DECIMAL columns as floats; str() then quantize gives back the stored cents.
    cost = Decimal(str(row['cost'] or 0)).quantize(COST_PLACES)
    return {name: row['group_key'], 'calls': int(row['calls']),
            'promptTokens': int(row['prompt_tokens'] or 0),
            'completionTokens': int(row['completion_tokens'] or 0),
            'cost': str(cost), 'errors': int(row['errors'])}
