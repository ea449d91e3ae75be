"""Waiting for a job to change without holding a connection: the long poll's ``?waitMs=``
waiters (and those of a feature that waits the same way, as the job event streams do), each
registered with a ``Watch`` whose one loop reads all their jobs at once, and the check of whether
a waiting request's client has gone away."""

import logging
import select
import socket
import threading
import time

from ..core.errors import TooManyWaitersError
from ..core.logs import log_event
from ..core.models import AiJob
from . import views

WATCH_CHUNK = 500  # job ids per batched re-read of the waiters' jobs
GONE_CHECK_S = 0.5  # a waiting request looks at its client's socket at least this often
HISTORY = 'history'  # what the watch wakes a waiter with: its job changed (Waiter.due)


def client_gone(environ):
    """True when the client of this request has closed its connection: the socket is readable
    and reading it (a peek, nothing consumed) gives end-of-file or an error. A client that sends
    its next request early is not gone. Without a server socket (the in-process test client)
    nobody is ever gone."""
    sock = environ.get('gunicorn.socket')
    if sock is None:
        return False
    try:
        # poll, not select: select() refuses descriptors above 1023, and a web process holding
        # a thousand waiting requests has those (each would look gone at once). The unpatched
        # poll: a zero-timeout system call that never waits, where gevent's would need the hub.
        poller = _original_poll()
        poller.register(sock.fileno(), select.POLLIN)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK) == b''
    except (OSError, ValueError):
        return True


def _original_poll():
    try:
        from gevent import monkey
    except ImportError:
        return select.poll()
    return monkey.get_original('select', 'poll')()


class Waiter:
    __slots__ = ('job_id', 'user_id', 'changed', 'seen', 'due', '_lock')

    def __init__(self, job_id, user_id):
        self.job_id, self.user_id = job_id, user_id
        self.changed = threading.Event()
        self.seen = None  # the job's status columns as the watcher last saw them
        self.due = set()  # what changed since the waiter last looked: HISTORY, or a feature's own
        self._lock = threading.Lock()

    def wake(self, what):
        with self._lock:
            self.due.add(what)
            self.changed.set()

    def take(self):
        """What changed since the last call, the wake-up cleared in the same step (a wake
        that comes after it is kept for the next call)."""
        with self._lock:
            self.changed.clear()
            due, self.due = self.due, set()
        return due


class Watch:
    """The ``?waitMs=`` requests of this process, capped per process and per user, and one loop
    that re-reads all their jobs' status columns in one query per poll interval (not one per
    waiter) and wakes the waiters whose job changed. A waiter holds no database connection while
    it waits. Under gevent the loop is a greenlet; in the in-process test client, a thread.

    A feature that waits the same way (the job event streams) builds a watch of its own: ``read``
    is then what it waits on (the latest history id of each job), and ``too_many`` its 429."""

    def __init__(
        self, store, poll_s, max_waiters, max_per_user, read=None, too_many=TooManyWaitersError
    ):
        self.store = store
        self.poll_s = poll_s
        self.max_waiters = max_waiters
        self.max_per_user = max_per_user
        self.read = read or self._read
        self.too_many = too_many
        self._lock = threading.Lock()
        self._by_job = {}  # job id -> set of Waiter
        self._per_user = {}
        self._count = 0
        self._loop = None
        # Set by the server: true once this process is shutting down; waits end then (the
        # client polls again elsewhere) instead of holding up the graceful stop.
        self.stopping = lambda: False

    @property
    def count(self):
        return self._count

    def enter(self, job_id, user_id):
        """A new waiter, or TOO_MANY_WAITERS (429) over either cap."""
        with self._lock:
            mine = self._per_user.get(user_id, 0)
            if self._count >= self.max_waiters or mine >= self.max_per_user:
                raise self.too_many()
            waiter = Waiter(job_id, user_id)
            self._count += 1
            self._per_user[user_id] = mine + 1
            self._by_job.setdefault(job_id, set()).add(waiter)
            if self._loop is None:
                self._loop = threading.Thread(target=self._run, name='status-watch', daemon=True)
                self._loop.start()
        return waiter

    def leave(self, waiter):
        with self._lock:
            self._count -= 1
            left = self._per_user[waiter.user_id] - 1
            if left:
                self._per_user[waiter.user_id] = left
            else:
                del self._per_user[waiter.user_id]
            waiters = self._by_job[waiter.job_id]
            waiters.discard(waiter)
            if not waiters:
                del self._by_job[waiter.job_id]

    def _run(self):
        while True:
            with self._lock:
                job_ids = list(self._by_job)
                if not job_ids:
                    self._loop = None
                    return
            try:
                rows = self.read(job_ids)
            except Exception:
                # Every waiter re-reads on its own instead and answers 503 if the store is gone.
                log_event('http.watch_failed', logging.WARNING, exc_info=True)
                rows = None
            with self._lock:
                for job_id, waiters in self._by_job.items():
                    for waiter in waiters:
                        if rows is None:
                            waiter.wake(HISTORY)
                            continue
                        seen = rows.get(job_id)
                        if seen != waiter.seen:
                            # The first sighting wakes the waiter once too: the job may have
                            # changed between the waiter's own read and this one.
                            waiter.seen = seen
                            waiter.wake(HISTORY)
            time.sleep(self.poll_s)

    def _read(self, job_ids):
        """{job id: its status columns}: what a ``?waitMs=`` request waits on."""
        rows = {}
        with self.store.connection():
            for start in range(0, len(job_ids), WATCH_CHUNK):
                chunk = job_ids[start : start + WATCH_CHUNK]
                query = AiJob.select(*views.STATUS_COLUMNS).where(AiJob.id.in_(chunk)).tuples()
                for row in query:
                    rows[row[0]] = row
        return rows
