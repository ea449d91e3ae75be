"""aijob engine: durable, observable AI jobs (ADR-003) on peewee, Redis lists and bottle."""
