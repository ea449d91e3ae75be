"""Real ``python aijob.py worker`` processes for the tests that need more than one process
(leader election, cooldowns, budgets, rate limits, the response cache): ``Worker`` and the
``spawn`` fixture, which closes every worker it started."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.helpers import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log_events(path, name):
    """The ``name`` events of a process's JSON log file, in order (a line that is no JSON, such
    as a traceback, is passed over)."""
    found = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get('event') == name:
            found.append(event)
    return found


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


@pytest.fixture
def spawn(tmp_path):
    started = []

    def start(env):
        started.append(Worker(tmp_path, env))
        return started[-1]

    yield start
    for worker in started:
        worker.close()
