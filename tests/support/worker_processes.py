"""Real ``python aijob.py worker`` processes for the tests that need more than one process
(leader election, cooldowns, budgets, rate limits, the response cache): ``Worker`` and the
``spawn`` fixture, which closes every worker it started. When such a test fails, the fixture
prints what its workers logged above INFO (a CI run keeps no log file, and a failure there is
often one only these lines explain)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log_lines(path):
    """(line, event) for each line of a process's JSON log file, in order; ``event`` is None
    for a line that is no JSON event, such as a traceback's."""
    for line in path.read_text(errors='replace').splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        yield line, event if isinstance(event, dict) else None


def log_events(path, name):
    """The ``name`` events of a process's JSON log file, in order."""
    return [event for _, event in log_lines(path) if event and event.get('event') == name]


class Worker:
    """``python aijob.py worker`` with its JSON log in a file."""

    def __init__(self, folder, env):
        self.log_path = folder / ('worker-%d.log' % time.monotonic_ns())
        self.log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(
            [sys.executable, 'aijob.py', 'worker'],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=self.log,
        )
        wait_until(lambda: self.events('worker.started') or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.log_path.read_text()

    def events(self, name):
        return log_events(self.log_path, name)

    def leads(self):
        return bool(self.events('leader.acquired'))

    def owns(self, job):
        return job.locked_by is not None and (':%d:' % self.proc.pid) in job.locked_by

    def republished(self):
        """Job ids this process's reaper handed over."""
        return [
            e['job_id'] for e in self.events('job.worker_lost') if e['outcome'] == 'republished'
        ]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


NOTABLE_LINES = 60  # per worker, printed when its test failed


def notable_lines(path):
    """The lines of a worker's log worth reading after a failure: events above INFO, and
    anything that is not a JSON event (a traceback)."""
    return [
        line
        for line, event in log_lines(path)
        if event is None or event.get('level') not in ('info', 'debug')
    ]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Marks a test whose call failed (``item.aijob_failed``), for ``spawn``'s teardown."""
    outcome = yield
    report = outcome.get_result()
    if report.when == 'call' and report.failed:
        item.aijob_failed = True


@pytest.fixture
def spawn(tmp_path, request):
    started = []

    def start(env):
        started.append(Worker(tmp_path, env))
        return started[-1]

    yield start
    for worker in started:
        worker.close()
    if getattr(request.node, 'aijob_failed', False):
        for worker in started:
            lines = notable_lines(worker.log_path)
            print('worker %d, %d notable log lines:' % (worker.proc.pid, len(lines)))
            print('\n'.join(lines[-NOTABLE_LINES:]))
