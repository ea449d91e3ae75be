"""aijob engine: durable, observable AI jobs on peewee, Redis lists and bottle (see docs/)."""
