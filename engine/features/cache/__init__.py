"""The response cache, opt-in per job definition: the guard that answers a call from an earlier
identical one (guard.py) and the purge of expired entries."""

USES = ()
