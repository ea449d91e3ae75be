"""Every setting, declared once: environment name, default, validation and help.

``Config.from_env()`` parses them all at start-up; a bad value raises ``ConfigError`` with one
line that names the variable, which the CLI prints instead of a traceback. Settings that only
make sense together (``TOGETHER``) are then checked together: a contradiction is refused the same
way, with one line naming both.
"""

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from .errors import ConfigError
from .redis_url import parse_redis_url


# ---------------------------------------------------------------- value parsers
def database_url(value):
    parts = urlsplit(value)
    if (
        parts.scheme == 'sqlite'
        and value.startswith('sqlite:///')
        and len(value) > len('sqlite:///')
    ):
        return value
    if parts.scheme in ('mysql', 'mariadb') and parts.hostname and parts.path.strip('/'):
        database_features(value)
        return value
    raise ValueError('expected sqlite:///PATH or mysql://USER:PASS@HOST:PORT/DB[?features=mysql]')


# The feature sets a MySQL/MariaDB URL may ask for with ``?features=``: ``mysql`` makes the store
# use MySQL's (no INSERT … RETURNING, no anonymous blocks, no CHECK constraint) even on MariaDB,
# so that MySQL's branch of the hot path runs against a MariaDB server (engine/core/store.py).
DATABASE_FEATURES = ('mysql',)


def database_features(url):
    """The feature set a MySQL/MariaDB URL forces (``?features=mysql``), or None: the server's
    own. Raises ValueError for any other query parameter or value."""
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    unknown = sorted(set(query) - {'features'})
    if unknown:
        raise ValueError('unknown database URL parameter %r (only features=)' % unknown[0])
    values = query.get('features')
    if values is None:
        return None
    if len(values) != 1 or values[0] not in DATABASE_FEATURES:
        raise ValueError('features= takes one of %s' % ', '.join(DATABASE_FEATURES))
    return values[0]


def redis_url(value):
    if value == '':
        return None
    try:
        parse_redis_url(value)
    except ValueError as exc:
        raise ValueError(
            '%s; expected redis://HOST:PORT/DB, redis+cluster://HOST:PORT[,HOST:PORT...], '
            'redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB], or empty for the '
            'in-memory queue' % exc
        ) from None
    return value


def positive_int(value):
    number = int(value)
    if number <= 0:
        raise ValueError('expected a whole number above 0')
    return number


# What ``auto`` concurrency means: a worker process (gevent) holds thousands of waiting calls;
# the embedded ``serve`` keeps a SQLite connection per running job, and a laptop's file limit
# (256 on macOS) is the bound there.
AUTO_CONCURRENCY_REDIS = 1000
AUTO_CONCURRENCY_EMBEDDED = 16


def concurrency(value):
    """A positive whole number, or ``auto`` (None until Config.from_env resolves it)."""
    if value.strip().lower() == 'auto':
        return None
    return positive_int(value)


def resolve_concurrency(values):
    auto = AUTO_CONCURRENCY_REDIS if values.get('redis_url') else AUTO_CONCURRENCY_EMBEDDED
    for attr in ('interactive_concurrency', 'background_concurrency'):
        if attr in values and values[attr] is None:
            values[attr] = auto


def non_negative_int(value):
    number = int(value)
    if number < 0:
        raise ValueError('expected a whole number, 0 or more')
    return number


def flag(value):
    lowered = value.strip().lower()
    if lowered in ('1', 'true', 'yes', 'on'):
        return True
    if lowered in ('0', 'false', 'no', 'off', ''):
        return False
    raise ValueError('expected 1 or 0')


def shard_count(value):
    number = int(value)
    if not 1 <= number <= 256:
        raise ValueError('expected a whole number, 1-256')
    return number


def lease_ms(value):
    number = int(value)
    if number < 300:
        raise ValueError('expected milliseconds, 300 or more')
    return number


def port_number(value):
    number = int(value)
    if not 1 <= number <= 65535:
        raise ValueError('expected a TCP port, 1-65535')
    return number


def port_or_empty(value):
    if value == '':
        return None
    return port_number(value)


def module_list(value):
    names = [name.strip() for name in value.split(',') if name.strip()]
    for name in names:
        if not re.match(r'^[A-Za-z_][\w.]*$', name):
            raise ValueError('%r is not a module name' % name)
    return tuple(names)


def http_url_or_empty(value):
    if value == '':
        return None
    parts = urlsplit(value)
    if parts.scheme in ('http', 'https') and parts.hostname:
        return value.rstrip('/')
    raise ValueError('expected http(s)://HOST[:PORT]/PATH, or empty for no provider')


def non_empty_text(value):
    if not value.strip():
        raise ValueError('expected a non-empty value')
    return value.strip()


def secret_or_empty(value):
    return value or None


# The one command the docs and the start-up refusals give for making a master key.
GENERATE_MASTER_KEY = (
    'python -c "import os, base64; print(base64.b64encode(os.urandom(32)).decode())"'
)


def master_key_or_empty(value):
    """The 32-byte AES-256 key from its base64 text (None when unset)."""
    if value == '':
        return None
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError('expected base64 text') from None
    if len(key) != 32:
        raise ValueError('expected base64 of exactly 32 bytes, got %d bytes' % len(key))
    return key


def json_object_or_empty(value):
    """A JSON object (None when unset); its entries are checked by the part that uses it."""
    if value == '':
        return None
    parsed = _json(value)
    if not isinstance(parsed, dict):
        raise ValueError('expected a JSON object')
    return parsed


def json_string_list_or_empty(value):
    """A JSON array of non-empty strings (None when unset)."""
    if value == '':
        return None
    parsed = _json(value)
    if not isinstance(parsed, list) or not all(isinstance(p, str) and p for p in parsed):
        raise ValueError('expected a JSON array of non-empty strings')
    return tuple(parsed)


def _json(value):
    try:
        return json.loads(value)
    except ValueError:
        raise ValueError('not valid JSON') from None


def json_object_or_file(value):
    """AIJOB_PROVIDERS: a JSON object, or ``@PATH`` to a file holding one (None when unset);
    its entries are checked by the gateway (engine/features/gateway/providers_config.py)."""
    if value == '':
        return None
    if value.startswith('@'):
        try:
            with open(value[1:], encoding='utf-8') as file:
                value = file.read()
        except OSError as exc:
            raise ValueError('cannot read %s: %s' % (value[1:], exc.strerror)) from None
    return json_object_or_empty(value.strip() or '{}')


def user_weights(value):
    """AIJOB_USER_WEIGHTS: a JSON object {user id: whole number 1-100} ({} when unset)."""
    parsed = json_object_or_empty(value) or {}
    for user, weight in parsed.items():
        if not user or isinstance(weight, bool) or not isinstance(weight, int):
            raise ValueError('expected {"user id": whole number 1-100, ...}')
        if not 1 <= weight <= 100:
            raise ValueError('the weight of a user must be 1-100')
    return parsed


def key_prefix(value):
    if not re.match(r'^[A-Za-z0-9_.:-]{1,64}$', value):
        raise ValueError('expected 1-64 letters, digits or _.:-')
    return value


def origin_list(value):
    """AIJOB_CORS_ORIGINS: comma-separated origins (scheme://host[:port], no path), or none."""
    origins = tuple(part.strip().rstrip('/') for part in value.split(',') if part.strip())
    for origin in origins:
        parts = urlsplit(origin)
        if parts.scheme not in ('http', 'https') or not parts.hostname or parts.path:
            raise ValueError('%r is not an origin (expected https://HOST[:PORT])' % origin)
    return origins


def jwt_secret_or_empty(value):
    """AIJOB_JWT_SECRET: HS256 wants a secret of at least 256 bits (RFC 7518 §3.2)."""
    if value == '':
        return None
    if len(value.encode('utf-8')) < 32:
        raise ValueError('expected at least 32 bytes')
    return value


def jwks_file_or_empty(value):
    """AIJOB_JWT_JWKS_FILE: a readable JSON Web Key Set (its keys are built by the JWT check)."""
    if value == '':
        return None
    try:
        with open(value, encoding='utf-8') as file:
            parsed = json.load(file)
    except OSError as exc:
        raise ValueError('cannot read %s: %s' % (value, exc.strerror)) from None
    except ValueError:
        raise ValueError('%s is not valid JSON' % value) from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get('keys'), list):
        raise ValueError('%s is not a JSON Web Key Set ({"keys": [...]})' % value)
    return value


def text_or_empty(value):
    return value.strip() or None


@dataclass(frozen=True)
class Setting:
    env: str
    default: str
    parse: callable
    help: str
    secret: bool = False  # may hold a password or key: never echoed in an error

    @property
    def attr(self):
        return self.env[len('AIJOB_') :].lower()


SETTINGS = (
    Setting(
        'AIJOB_DATABASE_URL',
        'sqlite:///aijob.db',
        database_url,
        'The store: sqlite:///PATH (embedded default) or mysql://USER:PASS@HOST:PORT/DB; '
        '?features=mysql makes a MariaDB store use only what MySQL has (for tests).',
        secret=True,
    ),
    Setting(
        'AIJOB_REDIS_URL',
        '',
        redis_url,
        'Redis for the queues: redis://HOST:PORT/DB or rediss:// (one server), '
        'redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster), '
        'redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB] (the master the '
        'sentinels name). Unset: the in-memory queue, one process only.',
        secret=True,
    ),
    Setting(
        'AIJOB_REDIS_PREFIX', 'aijob', key_prefix, 'Prefix of every Redis key this service writes.'
    ),
    Setting(
        'AIJOB_QUEUE_SHARDS',
        '1',
        shard_count,
        'Redis hash tags the queues are spread over (shard s of both queues shares one), a '
        "job's shard chosen from its user; raise it to spread the queues over the nodes of a "
        'Redis Cluster. Changing it loses nothing: consumers drain the shards of the old count '
        'too.',
    ),
    Setting(
        'AIJOB_USER_WEIGHTS',
        '',
        user_weights,
        'Fair share: JSON {"user id": weight}; within each queue and priority band workers take '
        'jobs round-robin over the users with jobs waiting, a user of weight w taking up to w '
        'turns in a row (default 1).',
    ),
    Setting(
        'AIJOB_MAX_RUNNING_PER_USER',
        '0',
        non_negative_int,
        "At most this many of one user's jobs running at once, over both queues and every "
        "worker; the user's other jobs stay queued (no thread held, no attempt spent). 0: no cap.",
    ),
    Setting(
        'AIJOB_LEADER_LEASE_MS',
        '15000',
        lease_ms,
        'The housekeeping lease (reaper, reconciler, outbox polling, purge run on one worker '
        'at a time): renewed every third of it; a dead leader is replaced after it expires.',
    ),
    Setting(
        'AIJOB_DEFINITIONS',
        '',
        module_list,
        'Comma-separated plugin modules whose register(app) adds job types (definition, '
        'projector, prompts, provider, tables).',
    ),
    Setting(
        'AIJOB_DB_POOL_SIZE', '32', positive_int, 'Most MySQL connections one process keeps open.'
    ),
    Setting(
        'AIJOB_LOCK_TTL_MS', '60000', positive_int, 'How long a job lock lasts without a heartbeat.'
    ),
    Setting(
        'AIJOB_HEARTBEAT_MS',
        '30000',
        positive_int,
        'How often a running job extends its lock and checks for cancellation.',
    ),
    Setting(
        'AIJOB_REAP_AFTER_MS',
        '90000',
        positive_int,
        'A running job whose lock expired this long ago is taken over or failed; also the '
        'TTL of a consumer heartbeat key.',
    ),
    Setting(
        'AIJOB_REAPER_INTERVAL_MS',
        '30000',
        positive_int,
        'How often the reaper looks for expired job locks.',
    ),
    Setting(
        'AIJOB_OUTBOX_LOCK_TTL_MS',
        '60000',
        positive_int,
        'An outbox event claimed (processing) longer than this is released to pending.',
    ),
    Setting(
        'AIJOB_OUTBOX_POLL_MS',
        '1000',
        positive_int,
        'How often the dispatcher polls the outbox (immediate dispatch is the fast path).',
    ),
    Setting(
        'AIJOB_OUTBOX_RELEASE_MS',
        '30000',
        positive_int,
        'How often the dispatcher releases expired outbox claims.',
    ),
    Setting(
        'AIJOB_RECONCILE_AFTER_MS',
        '60000',
        positive_int,
        'A job queued longer than this with no live queue entry is published again.',
    ),
    Setting(
        'AIJOB_SNAPSHOT_TTL_MS',
        str(30 * 24 * 3600 * 1000),
        positive_int,
        'Input snapshots expire this long after creation; the purger deletes those of finished '
        'jobs, which can then no longer be retried by an admin.',
    ),
    Setting(
        'AIJOB_OUTBOX_RETENTION_MS',
        str(7 * 24 * 3600 * 1000),
        positive_int,
        'Published and dead outbox events older than this are deleted by the purger.',
    ),
    Setting(
        'AIJOB_HISTORY_RETENTION_MS',
        str(30 * 24 * 3600 * 1000),
        positive_int,
        'History rows (ai_job_event) older than this, of jobs that finished longer ago than '
        'this, are deleted by the purger.',
    ),
    Setting(
        'AIJOB_PURGE_INTERVAL_MS',
        '3600000',
        positive_int,
        'How often the purger deletes expired snapshots, old outbox events, old history rows '
        'and old webhook deliveries.',
    ),
    Setting(
        'AIJOB_INTERACTIVE_CONCURRENCY',
        'auto',
        concurrency,
        'Most ai-interactive jobs one process runs at once. A waiting job costs no thread and '
        'no connection, so this may be in the thousands: the provider rate limits, budgets and '
        'AIJOB_MAX_RUNNING_PER_USER decide how many calls actually run. auto: %d with Redis '
        '(worker processes), %d with the in-memory queue (`serve`, where each running job keeps '
        'a SQLite connection).' % (AUTO_CONCURRENCY_REDIS, AUTO_CONCURRENCY_EMBEDDED),
    ),
    Setting(
        'AIJOB_BACKGROUND_CONCURRENCY',
        'auto',
        concurrency,
        'Most ai-background jobs one process runs at once; auto as AIJOB_INTERACTIVE_CONCURRENCY.',
    ),
    Setting(
        'AIJOB_CLAIM_AHEAD_MS',
        '20',
        non_negative_int,
        'How much work a worker thread takes at once: it pops and locks as many jobs as it '
        'expects to finish in this many milliseconds (from the time jobs took so far; at least '
        'one, at most 50), and commits their results together. 0: one job at a time.',
    ),
    Setting(
        'AIJOB_SHUTDOWN_GRACE_MS',
        '30000',
        positive_int,
        'On SIGTERM, how long running jobs may finish before they are handed back.',
    ),
    # ---- HTTP API
    Setting(
        'AIJOB_PORT', '8000', port_number, 'TCP port of `serve` and `web` when --port is not given.'
    ),
    Setting(
        'AIJOB_WEB_WORKERS',
        '4',
        positive_int,
        'gunicorn worker processes of `web` when --workers is not given.',
    ),
    Setting(
        'AIJOB_MAX_ACTIVE_JOBS_PER_USER',
        '100',
        non_negative_int,
        'Most queued or running jobs one user may have (TOO_MANY_JOBS beyond); 0: no limit.',
    ),
    Setting(
        'AIJOB_DAILY_JOB_QUOTA',
        '10000',
        non_negative_int,
        'Most jobs one user may create per UTC day (QUOTA_EXCEEDED beyond); 0: no limit.',
    ),
    Setting(
        'AIJOB_MAX_BODY_BYTES',
        '1048576',
        positive_int,
        'Largest request body the API accepts (413 beyond).',
    ),
    Setting(
        'AIJOB_STATUS_WAIT_POLL_MS',
        '100',
        positive_int,
        'How often GET /api/ai/jobs/{id}?waitMs= re-reads the job while it waits for a change.',
    ),
    Setting(
        'AIJOB_REQUEST_TIMEOUT_MS',
        '30000',
        positive_int,
        'A request body still incomplete this long after the API starts reading it gets 408 '
        'REQUEST_TIMEOUT; request headers and idle keep-alive connections get at most 5 s (or '
        'this, if shorter) before the connection is closed.',
    ),
    Setting(
        'AIJOB_MAX_WAITERS',
        '1000',
        positive_int,
        'Most GET /api/ai/jobs/{id}?waitMs= requests one web process holds at once '
        '(429 TOO_MANY_WAITERS beyond).',
    ),
    Setting(
        'AIJOB_MAX_WAITERS_PER_USER',
        '50',
        positive_int,
        'Most ?waitMs= requests of one user that one web process holds at once '
        '(429 TOO_MANY_WAITERS beyond).',
    ),
    # ---- credentials and safety (the providers are the gateway feature's)
    Setting(
        'AIJOB_PLATFORM_API_KEY',
        '',
        secret_or_empty,
        'The platform key (credentialMode platform_key) for the OpenAI-compatible provider; '
        'never stored in the database. Unset: platform_key jobs get PLATFORM_UNAVAILABLE.',
        secret=True,
    ),
    Setting(
        'AIJOB_CREDENTIAL_MASTER_KEY',
        '',
        master_key_or_empty,
        'Base64 of 32 random bytes: the AES-256-GCM key of stored user API keys and the root '
        'of webhook signing secrets. Unset: serve on SQLite keeps a development key in a file '
        'beside the database; web and worker run without webhooks and user keys, and refuse to '
        'start if the store already holds some. Generate one with: ' + GENERATE_MASTER_KEY,
        secret=True,
    ),
    Setting(
        'AIJOB_CONTENT_SAFETY_PATTERNS',
        '',
        json_string_list_or_empty,
        'JSON array of case-insensitive regular expressions that block job input and output '
        'when a definition asks for a safety check. Unset: block private keys only.',
    ),
    # ---- issue 33: who may call (engine/http/access.py, jwt_auth.py, job_tokens.py, cors.py)
    Setting(
        'AIJOB_JWT_SECRET',
        '',
        jwt_secret_or_empty,
        'Accept JSON Web Tokens your application signs with HS256 and this shared secret (at '
        'least 32 bytes); `sub` is the user id, the role is always user. Unset (and no '
        'AIJOB_JWT_JWKS_*): no JWT is accepted.',
        secret=True,
    ),
    Setting(
        'AIJOB_JWT_JWKS_URL',
        '',
        http_url_or_empty,
        'Accept RS256/ES256 JSON Web Tokens whose keys this JWKS URL publishes (fetched, cached, '
        'fetched again once when a token names an unknown kid).',
    ),
    Setting(
        'AIJOB_JWT_JWKS_FILE',
        '',
        jwks_file_or_empty,
        'As AIJOB_JWT_JWKS_URL, the JSON Web Key Set read from this file at start-up.',
    ),
    Setting(
        'AIJOB_JWT_ISSUER',
        '',
        text_or_empty,
        'When set, a JWT must carry this `iss`.',
    ),
    Setting(
        'AIJOB_JWT_AUDIENCE',
        '',
        text_or_empty,
        'When set, a JWT must carry this `aud` (one of its values).',
    ),
    Setting(
        'AIJOB_JWT_LEEWAY_S',
        '30',
        non_negative_int,
        "Seconds of clock difference allowed on a JWT's exp, nbf and iat.",
    ),
    Setting(
        'AIJOB_PUBLIC_TOKEN_TTL_S',
        '3600',
        positive_int,
        'How long the publicAccessToken of a create answer stays good: it reads, polls, streams '
        'and (where the job type allows it) cancels that one job.',
    ),
    Setting(
        'AIJOB_CORS_ORIGINS',
        '',
        origin_list,
        'Comma-separated origins (https://app.example.com) whose pages may call the job read, '
        'stream and cancel endpoints (CORS headers and preflight). Unset: none.',
    ),
)


@dataclass(frozen=True)
class Together:
    """Two settings that only make sense together: ``below`` must stay under ``above`` (times
    ``scale``: 1000 for a setting in seconds), or at most equal it with ``or_equal``."""

    below: str
    above: str
    why: str
    scale: int = 1
    or_equal: bool = False

    def refusal(self, values):
        """One line naming both settings, or None when they agree."""
        low = values[self.below[len('AIJOB_') :].lower()]
        high = values[self.above[len('AIJOB_') :].lower()]
        if low < high * self.scale or (self.or_equal and low == high * self.scale):
            return None
        limit = '%s=%d' % (self.above, high)
        if self.scale != 1:
            limit += ' (%d ms)' % (high * self.scale)
        relation = 'at most' if self.or_equal else 'below'
        return '%s=%d must be %s %s: %s' % (self.below, low, relation, limit, self.why)


# Checked at start-up, after every setting parsed on its own (Config.from_env).
TOGETHER = (
    Together(
        'AIJOB_HEARTBEAT_MS',
        'AIJOB_LOCK_TTL_MS',
        "a running job's lock would expire between two heartbeats and the job be taken over",
    ),
    Together(
        'AIJOB_HEARTBEAT_MS',
        'AIJOB_REAP_AFTER_MS',
        "a live worker's heartbeat key (it lasts AIJOB_REAP_AFTER_MS) would expire between two "
        'heartbeats and its messages be handed to others',
    ),
)


def check_together(values, rules=TOGETHER):
    """Raise ConfigError with the first pair of ``rules`` that contradicts itself."""
    for together in rules:
        refusal = together.refusal(values)
        if refusal:
            raise ConfigError(refusal)


JWT_KEY_SOURCES = ('AIJOB_JWT_SECRET', 'AIJOB_JWT_JWKS_URL', 'AIJOB_JWT_JWKS_FILE')


def check_jwt(values):
    """One key source for JWTs at most, and no JWT claim check without one (it would be believed
    to guard something)."""
    sources = [env for env in JWT_KEY_SOURCES if values[env[len('AIJOB_') :].lower()]]
    if len(sources) > 1:
        raise ConfigError('%s and %s: set one JWT key source only' % (sources[0], sources[1]))
    if not sources:
        for env in ('AIJOB_JWT_ISSUER', 'AIJOB_JWT_AUDIENCE'):
            if values[env[len('AIJOB_') :].lower()]:
                raise ConfigError(
                    '%s is set but no JWT key source is (%s)' % (env, ', '.join(JWT_KEY_SOURCES))
                )


class Config:
    """Parsed settings as attributes: ``AIJOB_DATABASE_URL`` → ``config.database_url``."""

    def __init__(self, values):
        self.__dict__.update(values)

    @classmethod
    def from_env(cls, environ=None, settings=None, together=None, derive=(), **overrides):
        """Parse ``settings`` (default: the kernel's SETTINGS; engine/extensions.py's
        ``load_config`` passes the features' too) from ``environ`` (default ``os.environ``), then
        check ``together`` (default TOGETHER) and run each ``derive(values, environ)`` (values a
        feature reads from variables its settings name). ``overrides`` are raw strings by env
        name and win over the environment (tests use them)."""
        environ = dict(os.environ if environ is None else environ)
        environ.update(overrides)
        values = {}
        for setting in SETTINGS if settings is None else settings:
            raw = environ.get(setting.env, setting.default)
            try:
                values[setting.attr] = setting.parse(raw)
            except (TypeError, ValueError) as exc:
                shown = setting.env if setting.secret else '%s=%r' % (setting.env, raw)
                raise ConfigError('%s is invalid: %s (%s)' % (shown, exc, setting.help)) from None
        check_together(values, TOGETHER if together is None else together)
        check_jwt(values)
        resolve_concurrency(values)
        for step in derive:
            step(values, environ)
        refuse_retired(environ)
        return cls(values)

    @property
    def uses_redis(self):
        return self.redis_url is not None


# Settings that were removed, and why: set, they would be believed to work.
RETIRED = {
    'AIJOB_RATE_LIMIT_MARGIN_MS': 'a request now counts until one window after its response, '
    'whatever its way to the provider (README "Provider rate limits"); unset it',
    'AIJOB_PRICE_TABLE': 'prices come from the provider config only: give each model its "price" '
    "in AIJOB_PROVIDERS (a provider without baseUrl prices a plugin's own, e.g. synthetic)",
    'AIJOB_RATE_LIMITS': 'limits come from the provider config only: give each model its '
    '"limits" in AIJOB_PROVIDERS (a provider without baseUrl limits a plugin\'s own, e.g. '
    'synthetic)',
}


def refuse_retired(environ):
    """ConfigError (one line) for a setting that no longer works."""
    for env, why in RETIRED.items():
        if env in environ:
            raise ConfigError('%s is no longer used: %s' % (env, why))


def describe(settings=SETTINGS):
    """Help text for every setting, for ``aijob.py config``."""
    return '\n'.join('%-32s default %-22r %s' % (s.env, s.default, s.help) for s in settings)
