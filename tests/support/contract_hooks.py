"""schemathesis hooks for tests/kernel/http/test_contract.py (loaded through SCHEMATHESIS_HOOKS).

Path parameters are sometimes ids that exist (the test creates a job, a credential and a webhook
and passes their ids in AIJOB_CONTRACT_IDS), so the checks reach past the 404 into each
operation's logic. Long polls are capped at WAIT_CAP_MS: a valid ``waitMs`` of 30 000 on a live
job would hold the run 30 s per case and prove nothing more than a short one."""

import json
import os
import uuid
import zlib

import schemathesis

WAIT_CAP_MS = 200
WEBHOOK_URL = 'https://127.0.0.1/hook'  # the test's serve allows private addresses
KNOWN_IDS = json.loads(os.environ.get('AIJOB_CONTRACT_IDS') or '{}')
ROLE = os.environ.get('AIJOB_CONTRACT_ROLE', 'user')
END_USER = 'contract-user'
JOBS = '/api/ai/jobs'


@schemathesis.hook
def map_path_parameters(context, path_parameters):
    """About half the generated ids (picked by a checksum of the value, so a run is
    reproducible) become ids that exist."""
    for name, value in list((path_parameters or {}).items()):
        known = KNOWN_IDS.get(name)
        if known and zlib.crc32(repr(value).encode()) % 2:
            path_parameters[name] = known[zlib.crc32(repr(value).encode()) % len(known)]
    return path_parameters


@schemathesis.hook
def map_query(context, query):
    return _cap_wait(query)


def _cap_wait(query):
    """Again just before the call: the stateful phase builds its queries past map_query."""
    if not query or 'waitMs' not in query:
        return query
    value = query['waitMs']
    if isinstance(value, int) and not isinstance(value, bool) and value > WAIT_CAP_MS:
        query['waitMs'] = WAIT_CAP_MS
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        query['waitMs'] = str(min(int(value), WAIT_CAP_MS))
    return query


@schemathesis.hook
def map_case(context, case):
    """In a case meant to be valid, a webhook URL names a host that resolves to an address the
    server allows (a schema cannot say which hosts resolve)."""
    if _positive(case) and isinstance(case.body, dict):
        for field in ('url', 'webhookUrl'):
            if isinstance(case.body.get(field), str):
                case.body[field] = WEBHOOK_URL
    return case


@schemathesis.hook
def before_call(context, case, kwargs):
    """In a case meant to be valid, the idempotency key is new (a changed body under an old key
    is, rightly, IDEMPOTENCY_KEY_REUSED) and the header and the body carry the same one. Done just
    before the call: schemathesis sets a case's headers again after map_case. Long polls are
    capped here too: the coverage phase's boundary values (``waitMs=29999``) skip map_query."""
    _cap_wait(case.query)
    if not _positive(case):
        return
    _user_id_for_the_role(case)
    key = uuid.uuid4().hex
    for name in list(case.headers or {}):
        if name.lower() == 'idempotency-key':
            case.headers[name] = key
    if isinstance(case.body, dict) and case.body.get('idempotencyKey') is not None:
        case.body['idempotencyKey'] = key


def _user_id_for_the_role(case):
    """A service key names the end user of a create or a list (400 without); anyone else may not
    (400 with): the document cannot say which credential a request carries."""
    if case.path != JOBS:
        return
    if case.method.upper() == 'POST' and isinstance(case.body, dict):
        if ROLE == 'service':
            case.body.setdefault('userId', END_USER)
        else:
            case.body.pop('userId', None)
    elif case.method.upper() in ('GET', 'HEAD'):
        if ROLE == 'service':
            case.query = dict(case.query or {}, userId=END_USER)
        elif case.query and 'userId' in case.query:
            case.query.pop('userId')


def _positive(case):
    return case.meta is not None and case.meta.generation.mode.value == 'positive'
