"""Property-based fuzzing of the HTTP API in-process through WSGI (issue 10 item 4): the create
body, the query parameters and the headers, with arbitrary JSON values, bytes, unicode digits,
lone surrogates, huge numbers, odd ISO dates and latin-1 header text. For every request: never a
5xx (a 503 only with a code the document gives for a configuration that is missing), the JSON
error shape for every non-2xx, a response that validates against /openapi.json (the Harness's
OpenApiCheck), and nothing internal leaked (WsgiClient's LEAK check). A refused create writes
nothing."""

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.models import (
    AiJob,
    AiJobSnapshot,
    UserModelCredential,
    canonical_json,
)
from engine.features.webhooks.models import WebhookEndpoint
from tests.support.api import ADMIN_JOBS, JOBS, job_body
from tests.support.wsgi import LEAK

pytestmark = pytest.mark.slow

USAGE = '/admin-api/ai/usage'
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# 503s that answer a missing configuration (no provider or master key), not a broken request.
ALLOWED_503 = {'PLATFORM_UNAVAILABLE', 'CREDENTIAL_STORAGE_UNAVAILABLE'}


def no_leak(text):
    """Messages echo the client's own text (an unknown jobType, an unknown field); text that
    would look like a leak there is left out so that LEAK keeps meaning the server's internals."""
    return not LEAK.search(text) and not LEAK.search(repr(text))


# ---------------------------------------------------------------- strategies
# Any code point, lone surrogates included (st.text() leaves them out by default).
ANY_CHAR = st.characters(exclude_categories=())
TEXT = st.text(ANY_CHAR, max_size=20).filter(no_leak)
LONG_TEXT = st.text(ANY_CHAR, min_size=60, max_size=300).filter(no_leak)
LATIN1 = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=40).filter(no_leak)
HUGE = st.integers(min_value=-(10**40), max_value=10**40)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
JOB_TYPES = st.sampled_from(['synthetic', 'flashcard_generation', 'nope', '', 'SYNTHETIC'])
OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        'priority': st.integers(min_value=-5, max_value=105) | JSON,
        'credentialMode': st.sampled_from(['platform', 'user', 'auto', 'x']) | JSON,
        'credentialId': TEXT | JSON,
        'promptVersion': TEXT | JSON,
        'outputSchemaVersion': TEXT | JSON,
    },
)
SYNTHETIC_INPUT = st.fixed_dictionaries(
    {},
    optional={
        'sleepMs': st.integers(min_value=-10, max_value=10) | JSON,
        'progressSteps': st.integers(min_value=-2, max_value=5) | JSON,
        'failWith': st.sampled_from(['PROVIDER_TIMEOUT', 'NOPE']) | JSON,
        'output': JSON,
    },
)
CREATE_BODY = st.fixed_dictionaries(
    {},
    optional={
        'jobType': JOB_TYPES | JSON,
        'targetType': st.sampled_from(['note', '']) | TEXT | LONG_TEXT | JSON,
        'targetId': st.sampled_from(['note-1']) | TEXT | LONG_TEXT | JSON,
        'input': SYNTHETIC_INPUT | JSON,
        'idempotencyKey': st.sampled_from(['k1', 'k2']) | TEXT | LONG_TEXT | JSON,
        'overrides': OVERRIDES | JSON,
    },
)
EXTRA_KEYS = st.dictionaries(TEXT, JSON, max_size=2)
CONTENT_TYPES = (
    st.sampled_from(
        [
            'application/json',
            'application/json; charset=utf-8',
            'APPLICATION/JSON',
            'application/problem+json',
            'text/plain',
            'application/x-www-form-urlencoded',
            '',
        ]
    )
    | LATIN1
)

# Query values: numbers as text (unicode digits too), odd ISO dates, anything at all.
DIGITS = st.text(st.sampled_from('0123456789²³①٣߃০१੩๓໓᠓０９'), min_size=1, max_size=6)
NUMBERS = st.sampled_from(['0', '1', '20', '100', '101', '30000', '30001', '-1', '+5', ' 5', '1e3'])
ISO = st.sampled_from(
    [
        '2026-06-20T00:00:00Z',
        '2026-06-20',
        '0001-01-01T00:00:00+14:00',
        '9999-12-31T23:59:59-14:00',
        '9999-12-31T23:59:59.999999Z',
        '2026-02-30T00:00:00Z',
        '2026-06-20T24:00:00Z',
        '2026-06-20T00:00:00+25:00',
        '2026-W25-6',
        '20260620T000000Z',
        '2026-06-20T00:00:00ZZ',
        '2026-06-20 00:00',
        '1970-01-01T00:00:00.000000001Z',
    ]
) | st.datetimes().map(lambda value: value.isoformat())
QUERY_TEXT = (
    DIGITS
    | NUMBERS
    | ISO
    | HUGE.map(str)
    | TEXT
    | st.sampled_from(['queued', 'succeeded,failed', 'PENDING', ' , ', 'ai-interactive', 'user'])
)
# What reaches the server: the UTF-8 of the text (surrogates as their 3 bytes), or any bytes.
QUERY_VALUE = QUERY_TEXT.map(lambda text: text.encode('utf-8', 'surrogatepass')) | st.binary(
    max_size=12
)


def query_params(names):
    pairs = st.lists(st.tuples(st.sampled_from(names), QUERY_VALUE), max_size=len(names) + 1)
    unknown = st.lists(
        st.tuples(st.sampled_from(['foo', 'waitMs', 'LIMIT']), QUERY_VALUE), max_size=1
    )
    return st.tuples(pairs, unknown).map(lambda both: both[0] + both[1])


# A header as WSGI delivers it: latin-1 text, which is a client's bytes one to one.
HEADER = LATIN1 | TEXT.map(lambda text: text.encode('utf-8', 'surrogatepass').decode('latin-1'))


def authorizations(token):
    return st.one_of(
        st.just('Bearer ' + token),
        st.just('bearer ' + token),
        st.just('Bearer  ' + token + ' '),
        HEADER.map(lambda junk: 'Bearer ' + token + junk),
        HEADER.map(lambda junk: 'Bearer ' + junk),
        HEADER,
    )


# ---------------------------------------------------------------- the checks
def check(response):
    """Every response: no 5xx but the configuration 503s, and the JSON error shape off 2xx."""
    assert response.status < 500 or response.status == 503, response
    if response.status < 300 or response.status == 304:
        return
    body = response.json
    assert set(body) == {'error'}, response
    error = body['error']
    assert set(error) <= {'code', 'message', 'field'}, response
    assert {'code', 'message'} <= set(error), response
    assert all(isinstance(value, str) and value for value in error.values()), response
    assert re.fullmatch('[A-Z][A-Z_]+', error['code']), response
    if response.status == 503:
        assert error['code'] in ALLOWED_503, response


def job_count():
    return AiJob.select().count()


# ---------------------------------------------------------------- the create body
@FUZZ
@given(body=CREATE_BODY, extra=EXTRA_KEYS, header_key=st.none() | HEADER)
def test_any_create_body_gets_a_documented_json_answer_and_a_refusal_writes_nothing(
    api, body, extra, header_key
):
    headers = {} if header_key is None else {'Idempotency-Key': header_key}
    before = job_count()
    response = api.a.post(JOBS, dict(extra, **body), headers=headers)
    check(response)
    after = job_count()
    if response.status == 201:
        assert after == before + 1, response
    else:
        assert after == before, response


@FUZZ
@given(
    raw=st.binary(max_size=64)
    | JSON.map(lambda value: json.dumps(value).encode('utf-8'))
    | CREATE_BODY.map(
        lambda body: json.dumps(job_body(**body), ensure_ascii=False).encode(
            'utf-8', 'surrogatepass'
        )
    ),
    content_type=st.none() | CONTENT_TYPES,
)
def test_any_bytes_with_any_content_type_get_a_documented_json_answer(api, raw, content_type):
    before = job_count()
    response = api.a.post(JOBS, body=raw, content_type=content_type)
    check(response)
    after = job_count()
    assert after == before + (response.status == 201), response


def test_a_valid_create_still_works_after_the_fuzzing_shapes(api):
    """The strategies above can reach 201: the plain body they start from is accepted."""
    response = api.a.post(JOBS, job_body())
    check(response)
    assert response.status == 201


# ---------------------------------------------------------------- raw JSON text (issue 24)
# What no JSON encoder writes, so the strategies above never send it: numbers beyond a double or
# that round to 0, integers at and past the digit limit, duplicate keys, a BOM, trailing
# garbage, other charsets, NUL and 4-byte characters, every field at and past its length limit.
EXTREME_NUMBERS = st.sampled_from(
    [
        '1e400',
        '-1e400',
        '1E+400',
        '1e-400',
        '-0.0',
        '0e-400',
        '1.7976931348623157e308',
        '-1.7976931348623159e308',
        '5e-324',
        '0.10000000000000000000000001',
        '123456789012345678901234567890.5',
    ]
)
# '1' + n zeros: n + 1 digits, around the limit (json_body.MAX_INTEGER_DIGITS) and past Python's.
HUGE_INTEGERS = st.builds(
    lambda sign, zeros: sign + '1' + '0' * zeros,
    st.sampled_from(['', '-']),
    st.sampled_from([18, 19, 20, 308, 400, 998, 999, 1000, 4300]),
)
ODD_CHARS = st.sampled_from(['\x00', '\U0001f600', '\U0001d11e', 'é', 'a', '\u2028', '"', '\\'])
ODD_TEXT = st.text(ODD_CHARS, max_size=8)


def json_string(text, ascii_only):
    return json.dumps(text, ensure_ascii=ascii_only)


RAW_STRING = st.builds(json_string, ODD_TEXT | TEXT, st.booleans())
RAW_SCALAR = (
    SCALARS.map(json.dumps).filter(lambda text: 'Infinity' not in text)
    | EXTREME_NUMBERS
    | HUGE_INTEGERS
    | RAW_STRING
)


def raw_object(values, duplicate=st.booleans()):
    """JSON object text; sometimes its first key comes again with another value."""

    def text(pairs, again):
        if again and pairs:
            pairs = pairs + [(pairs[0][0], pairs[-1][1])]
        return '{' + ','.join('%s:%s' % pair for pair in pairs) + '}'

    return st.builds(text, st.lists(st.tuples(RAW_STRING, values), max_size=4), duplicate)


RAW_VALUE = st.recursive(
    RAW_SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda items: '[' + ','.join(items) + ']')
        | raw_object(inner)
    ),
    max_leaves=10,
)
# One character repeated to a length: at the limit and one past it.
FILL = st.sampled_from(['a', '\U0001f600', '\x00', 'é', '\x00\U0001f600'])


def at_and_past(limit):
    return st.builds(
        lambda fill, length: json_string((fill * length)[:length], False),
        FILL,
        st.sampled_from([limit, limit + 1]),
    )


FIELD_LIMITS = {'targetType': 64, 'targetId': 128, 'idempotencyKey': 255}
RAW_OVERRIDES = st.builds(
    lambda priority, version: '{"priority":%s,"promptVersion":%s}' % (priority, version),
    st.sampled_from(['1', '50', '100.0']) | EXTREME_NUMBERS | HUGE_INTEGERS,
    RAW_STRING | at_and_past(32),
)
RAW_CREATE = st.fixed_dictionaries(
    {
        'jobType': st.just('"synthetic"'),
        'targetType': st.just('"note"') | at_and_past(64) | RAW_STRING,
        'targetId': st.just('"n1"') | at_and_past(128) | RAW_STRING,
        'input': st.just('{}') | raw_object(RAW_VALUE).map(lambda obj: '{"output":%s}' % obj),
    },
    optional={
        'idempotencyKey': at_and_past(255) | RAW_STRING,
        'overrides': RAW_OVERRIDES,
    },
)
CHARSETS = st.sampled_from(
    [None, 'utf-8', 'utf-16', 'utf-16-le', 'utf-32', 'latin-1', 'cp1252', 'shift_jis']
)
TRAILING = st.sampled_from(['', '', '', ' ', '\n', 'x', ' {}', ',', ']', '\x00', '//'])


def raw_create_text(fields, duplicate_field):
    pairs = [('"%s"' % name, value) for name, value in fields.items()]
    if duplicate_field and pairs:
        pairs.append(pairs[-1])
    return '{' + ','.join('%s:%s' % pair for pair in pairs) + '}'


def encode_as(text, charset):
    if charset in (None, 'utf-8'):
        return text.encode('utf-8', 'surrogatepass')
    return text.encode(charset, 'replace')


@FUZZ
@given(
    fields=RAW_CREATE,
    duplicate_field=st.booleans(),
    bom=st.booleans(),
    trailing=TRAILING,
    charset=CHARSETS,
)
def test_raw_json_text_of_any_shape_is_refused_cleanly_or_stored_exactly(
    api, fields, duplicate_field, bom, trailing, charset
):
    text = ('\ufeff' if bom else '') + raw_create_text(fields, duplicate_field) + trailing
    content_type = 'application/json' + ('; charset=%s' % charset if charset else '')
    raw = encode_as(text, charset)
    before = job_count()
    response = api.a.post(JOBS, body=raw, content_type=content_type)
    check(response)
    assert response.status in (200, 201, 400, 422), response  # 200: a key sent again
    if response.status != 201:
        assert job_count() == before, response
        return
    assert job_count() == before + 1, response
    # Accepted: every value is stored as sent (JSON is UTF-8, whatever the charset says), as
    # the standard parser reads the text.
    sent = json.loads(raw.decode('utf-8'))
    job = AiJob.get_by_id(response.json['jobId'])
    assert (job.target_type, job.target_id) == (sent['targetType'], sent['targetId'])
    assert job.idempotency_key == sent.get('idempotencyKey')
    snapshot = AiJobSnapshot.get(AiJobSnapshot.job_id == job.id)
    assert snapshot.content['input'] == sent['input']
    assert canonical_json(snapshot.content['input']) == canonical_json(sent['input'])


@FUZZ
@given(
    body=raw_object(RAW_VALUE, duplicate=st.booleans()),
    endpoint=st.sampled_from(['/api/ai/webhooks', '/api/ai/credentials']),
    field=st.sampled_from(['url', 'events', 'jobTypes', 'provider', 'apiKey']),
    value=RAW_VALUE | at_and_past(512) | at_and_past(2048) | at_and_past(64),
)
def test_raw_json_in_webhook_and_credential_bodies_is_refused_cleanly(
    keyed_api, body, endpoint, field, value
):
    """The other JSON bodies read through the same parser: no 5xx, the JSON error shape, and
    a refusal stores nothing (a 201 is possible: a plain string may be a valid apiKey)."""
    text = body[:-1] + (',' if body != '{}' else '') + '"%s":%s}' % (field, value)
    before = WebhookEndpoint.select().count(), UserModelCredential.select().count()
    raw = text.encode('utf-8', 'surrogatepass')
    response = keyed_api.a.post(endpoint, body=raw, content_type='application/json')
    check(response)
    after = WebhookEndpoint.select().count(), UserModelCredential.select().count()
    assert after == before or response.status == 201, response


def test_the_raw_strategies_reach_both_answers(api):
    """An extreme number is refused, and a raw body at every field's limit is stored."""
    limits = {name: json_string('\U0001f600' * n, False) for name, n in FIELD_LIMITS.items()}
    ok = raw_create_text(dict(limits, jobType='"synthetic"', input='{}'), False)
    assert api.a.post(JOBS, body=ok.encode(), content_type='application/json').status == 201
    bad = raw_create_text({'jobType': '"synthetic"', 'input': '{"a":-1e400}'}, False)
    refused = api.a.post(JOBS, body=bad.encode(), content_type='application/json')
    assert refused.error_code == 'INVALID_JSON'


# ---------------------------------------------------------------- query parameters
def finished_job(api):
    """A cancelled job of user a: terminal, so a waitMs poll of it answers at once."""
    job_id = api.create()
    assert api.a.post(JOBS + '/' + job_id + '/cancel').status == 200
    return job_id


@FUZZ
@given(wait=st.none() | QUERY_VALUE, etag=st.none() | HEADER, who=st.sampled_from('ab'))
def test_status_poll_with_any_wait_and_if_none_match(api, wait, etag, who):
    job_id = getattr(api, '_fuzz_job', None) or finished_job(api)
    api._fuzz_job = job_id
    query = [] if wait is None else [('waitMs', wait)]
    headers = {} if etag is None else {'If-None-Match': etag}
    response = getattr(api, who).get(JOBS + '/' + job_id, query=query, headers=headers)
    check(response)
    if who == 'b':
        assert response.status in (400, 404), response


@FUZZ
@given(job_id=st.text(ANY_CHAR, min_size=1, max_size=40).filter(lambda s: '/' not in s))
def test_status_of_any_job_id(api, job_id):
    # PATH_INFO as WSGI delivers it: the UTF-8 bytes of the path as latin-1 text.
    path = JOBS + '/' + job_id.encode('utf-8', 'surrogatepass').decode('latin-1')
    response = api.a.get(path)
    check(response)
    assert response.status in (200, 400, 404), response


@FUZZ
@given(
    params=query_params(
        [
            'jobType',
            'lifecycleStatus',
            'queueName',
            'userId',
            'createdFrom',
            'createdTo',
            'limit',
            'cursor',
        ]
    )
)
def test_admin_job_list_with_any_parameters(api, params):
    response = api.admin.get(ADMIN_JOBS, query=params)
    check(response)
    assert response.status in (200, 400), response


@FUZZ
@given(params=query_params(['since', 'until', 'groupBy']))
def test_admin_usage_with_any_parameters(api, params):
    response = api.admin.get(USAGE, query=params)
    check(response)
    assert response.status in (200, 400), response


# ---------------------------------------------------------------- headers
@FUZZ
@given(data=st.data(), endpoint=st.sampled_from(['create', 'status', 'list', 'usage']))
def test_any_authorization_header(api, data, endpoint):
    owner = data.draw(st.sampled_from(['a', 'admin']))
    authorization = data.draw(authorizations(api.tokens[owner]))
    headers = {'Authorization': authorization}
    before = job_count()
    if endpoint == 'create':
        key = data.draw(st.none() | HEADER)
        if key is not None:
            headers['Idempotency-Key'] = key
        response = api.anon.post(JOBS, job_body(), headers=headers)
    elif endpoint == 'status':
        job_id = getattr(api, '_fuzz_job', None) or finished_job(api)
        api._fuzz_job = job_id
        before = job_count()
        headers['If-None-Match'] = data.draw(HEADER)
        response = api.anon.get(JOBS + '/' + job_id, headers=headers)
    else:
        response = api.anon.get(ADMIN_JOBS if endpoint == 'list' else USAGE, headers=headers)
    check(response)
    if endpoint != 'create' or response.status != 201:
        assert job_count() == before, response
    token = api.tokens[owner]
    if authorization in ('Bearer ' + token, 'bearer ' + token, 'Bearer  ' + token + ' '):
        assert response.status != 401, response
