"""Provider rate limits per provider/model (the provider config's ``limits``), held by every
worker together (limiter.py). The limits are the gateway's provider config."""

USES = ()
