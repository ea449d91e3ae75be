"""Log lines are events with dotted names (``worker.started``), written through ``log_event``
only, so that an operator can grep and alert on a stable name, and content filtering applies to
every line."""

import ast
import json
import logging
import pathlib
import re

import pytest

from engine.core.logs import JsonFormatter, log_event
from tests.support import paths

ROOT = pathlib.Path(paths.ROOT)
EVENT_NAME = re.compile(r'^[a-z_]+(\.[a-z_]+)+$')


def engine_calls():
    for path in sorted((ROOT / 'engine').rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                yield path.relative_to(ROOT), node


def test_every_log_event_has_a_dotted_name():
    names, wrong = set(), []
    for path, call in engine_calls():
        if getattr(call.func, 'id', None) == 'log_event' and call.args:
            name = call.args[0]
            if isinstance(name, ast.Constant) and EVENT_NAME.match(name.value):
                names.add(name.value)
            else:
                wrong.append('%s:%d' % (path, call.lineno))
    assert wrong == [] and {'worker.started', 'http.request', 'job.finished'} <= names


@pytest.mark.slow
def test_no_module_logs_free_text_beside_log_event():
    free = [
        '%s:%d' % (path, call.lineno)
        for path, call in engine_calls()
        if isinstance(call.func, ast.Attribute)
        and call.func.attr in ('debug', 'info', 'warning', 'error', 'exception')
        and getattr(call.func.value, 'id', None) in ('log', 'logger', 'logging')
    ]
    assert free == []


def test_a_line_is_json_with_the_event_and_its_fields_but_no_content(caplog):
    with caplog.at_level(logging.INFO, logger='aijob'):
        log_event('job.created', job_id='j1', input={'secret': 1}, token='aj_x')
    line = json.loads(JsonFormatter().format(caplog.records[-1]))
    assert line['event'] == 'job.created' and line['job_id'] == 'j1'
    assert 'input' not in line and 'token' not in line
