"""Canonical JSON and its SHA-256: keys sorted at every depth (DESIGN decision 8), so equal
objects hash equal whatever order their keys were built in."""
import hashlib
import json


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(',', ':'), ensure_ascii=False,
                      allow_nan=False)


def canonical_hash(value):
    return hashlib.sha256(canonical_json(value).encode('utf-8')).hexdigest()
