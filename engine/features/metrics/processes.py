"""Where a process's counts live: in its own memory (``worker``, tests), or in files of one
directory that every gunicorn worker of ``serve`` and ``web`` writes and any of them sums at a
scrape (prometheus_client's multiprocess mode, README "Metrics")."""

import contextlib
import os
import shutil
import tempfile

from prometheus_client import values

from . import counters

MULTIPROC_ENV = 'PROMETHEUS_MULTIPROC_DIR'


def multiprocess_dir():
    """The directory of every process's metric files, or None in single-process mode."""
    return os.environ.get(MULTIPROC_ENV) or None


@contextlib.contextmanager
def gunicorn_master():
    """Around gunicorn's master (the ``gunicorn_master`` hook point): the workers it forks
    count into one directory; a directory made here is removed when the master is done."""
    directory, made_here = use_multiprocess_dir()
    master = os.getpid()
    try:
        yield directory
    finally:
        # A worker leaves through here too (gunicorn's SystemExit unwinds the forked stack):
        # only the master, last out, removes the directory.
        if made_here and os.getpid() == master:
            shutil.rmtree(directory, ignore_errors=True)


def use_multiprocess_dir():
    """Before gunicorn forks: every process of this server writes its counters to files in one
    directory, which a scrape of any worker sums. An operator's PROMETHEUS_MULTIPROC_DIR is
    used as it is; otherwise a fresh temporary one. Files left by an earlier run are removed:
    their counts belong to processes that are gone. Returns (directory, made_here)."""
    directory = multiprocess_dir()
    made_here = directory is None
    if made_here:
        directory = tempfile.mkdtemp(prefix='aijob-metrics-')
    else:
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith('.db'):
                os.remove(os.path.join(directory, name))
    os.environ[MULTIPROC_ENV] = directory
    # prometheus_client picks its value class when it is imported; it was imported before this
    # process knew it would fork, so it picks again now. The families are made on first use,
    # so every child made from here on writes to the directory.
    values.ValueClass = values.get_value_class()
    counters.reset_all()
    return directory, made_here


def use_single_process():
    """``python aijob.py worker``: counts in its own memory and serves only them, even when
    PROMETHEUS_MULTIPROC_DIR is set for the web processes of the same host (a Procfile's
    environment is shared): summing web's files there would count web's requests twice."""
    os.environ.pop(MULTIPROC_ENV, None)
    values.ValueClass = values.get_value_class()
    counters.reset_all()
