"""Budgets in money per user, job type or in total (decision 17): the ledger (ledger.py), the
guard that reserves each call's maximum cost (guard.py), the admin API (routes.py). A call's
maximum cost needs its prompt's bound, measured as the gateway's client renders it."""

USES = ('gateway',)
