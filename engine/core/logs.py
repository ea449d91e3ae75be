"""Structured logging: one JSON object per line (contracts §8.3).

Call ``log_event('job.created', job_id=..., job_type=...)``; fields become keys of the line. Job
input and output, tokens, keys and request bodies must never be logged: fields with those names
are dropped here as a last line of defence, but callers should not pass them in the first place.
"""

import datetime
import json
import logging
import sys

LOGGER_NAME = 'aijob'

# Names of fields that may carry job content or secrets; a line never contains them.
FORBIDDEN_FIELDS = frozenset(
    (
        'input',
        'output',
        'validated_output',
        'content',
        'payload',
        'body',
        'snapshot',
        'token',
        'api_key',
        'apikey',
        'authorization',
        'password',
        'secret',
        'key',
        'encrypted_key',
        'overrides',
    )
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, logger, event, then the record's fields.
    Exceptions are reduced to their type and stack frames: an exception message may quote job
    content or SQL parameters, so it is left out."""

    def format(self, record):
        line = {
            'ts': datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec='milliseconds')
            .replace('+00:00', 'Z'),
            'level': record.levelname.lower(),
            'logger': record.name,
            'event': record.getMessage(),
        }
        line.update(safe_fields(getattr(record, 'fields', None) or {}))
        if record.exc_info:
            line['error_type'] = record.exc_info[0].__name__
            line['stack'] = _frames(record.exc_info[2])
        return json.dumps(line, default=str, ensure_ascii=False)


def safe_fields(fields):
    return {name: value for name, value in fields.items() if name.lower() not in FORBIDDEN_FIELDS}


def _frames(tb):
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(
            '%s:%d %s' % (code.co_filename.rsplit('/', 1)[-1], tb.tb_lineno, code.co_name)
        )
        tb = tb.tb_next
    return frames[-8:]


_LOGGER = logging.getLogger(LOGGER_NAME)  # getLogger takes the logging module's lock each call


def log_event(event, level=logging.INFO, exc_info=None, **fields):
    _LOGGER.log(level, event, exc_info=exc_info, extra={'fields': fields})


def configure(stream=None, level=logging.INFO):
    """Send the ``aijob`` logger (and the root logger) to ``stream`` as JSON lines. Idempotent."""
    root = logging.getLogger()
    for handler in root.handlers:
        if getattr(handler, 'aijob_json', False):
            return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.aijob_json = True
    root.addHandler(handler)
    root.setLevel(level)
    # A JSON line names no source line, thread or process: records need not look them up (the
    # logging HOWTO's "Optimization"; one line per request makes it measurable).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    quiet_sql_logging()


def quiet_sql_logging():
    """peewee logs every statement with its parameters at DEBUG, and those parameters hold job
    input, output and credential ciphertext: keep that logger above DEBUG whatever the level."""
    logging.getLogger('peewee').setLevel(logging.INFO)


def gunicorn_logconfig():
    """gunicorn's ``logconfig_dict``: its own error log as JSON lines too, no access log (the
    app writes one ``http.request`` line per request). The root logger is left to configure()."""
    return {
        'version': 1,
        'disable_existing_loggers': False,
        'formatters': {'json': {'()': 'engine.core.logs.JsonFormatter'}},
        'handlers': {
            'stderr': {
                'class': 'logging.StreamHandler',
                'formatter': 'json',
                'stream': 'ext://sys.stderr',
            }
        },
        # gunicorn merges this over its defaults, whose root logger names a handler we drop;
        # the root logger's handler is added by configure() in each worker.
        'root': {'level': 'INFO', 'handlers': []},
        'loggers': {
            'gunicorn.error': {'level': 'INFO', 'handlers': ['stderr'], 'propagate': False},
            'gunicorn.access': {'level': 'WARNING', 'handlers': [], 'propagate': False},
        },
    }
