"""``python aijob.py web`` with one of its suspects changed, for ``poll_bench.py --variants``
(issue 34, item 5): which part of the status GET's tail is aijob's. Each variant is the same
``web`` with one thing changed, so that one run can compare them side by side:

    default       ``web`` as it ships
    no_reuse_port gunicorn's one listening socket shared by the workers, whichever wakes first
                  accepting (16/0/0/0 to 4/4/4/4 of wrk's connections)
    reuse_port    one listening socket per worker (SO_REUSEPORT): the kernel spreads connections
    gc_off        the collector off in the workers (is a collection pause the tail?)
    no_keepalive  every answer closes its connection, as gunicorn's sync workers do: each
                  request is accepted anew by whichever worker is free
    workers2, workers8  that many gevent workers instead of --workers
    balanced_accept  a worker that holds k connections waits k ms (10 at most) before it
                  accepts another, so that the idler workers take the next ones

    AIJOB_DATABASE_URL=mysql://… AIJOB_REDIS_URL=redis://… \\
        python benchmarks/poll_variant.py reuse_port --port 8200 --workers 4
"""

import os
import sys

from gevent import monkey

monkey.patch_all(aggressive=False)  # first, as aijob.py does for web

import gc  # noqa: E402

from gevent.server import StreamServer  # noqa: E402
from gunicorn.workers import ggevent  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from engine import server  # noqa: E402


def _option(name, value):
    options_of = server.gunicorn_options

    def options(*args, **kwargs):
        return dict(options_of(*args, **kwargs), **{name: value})

    server.gunicorn_options = options


def _gc_off():
    load = server.AijobGunicorn.load

    def load_then_disable(self):
        app = load(self)
        gc.disable()
        return app

    server.AijobGunicorn.load = load_then_disable


class BalancedStreamServer(StreamServer):
    """gevent's StreamServer that, after each accept, stops accepting for a moment that grows
    with the connections this worker already holds."""

    def do_handle(self, *args):
        super().do_handle(*args)
        held = len(self.pool) if self.pool is not None else 0
        if held > 1:
            self.stop_accepting()
            self._timer = self.loop.timer(min(0.010, 0.001 * held))
            self._timer.start(self._start_accepting_if_started)


def _balanced_accept():
    ggevent.StreamServer = BalancedStreamServer


VARIANTS = {
    'default': lambda: None,
    'no_reuse_port': lambda: _option('reuse_port', False),
    'reuse_port': lambda: _option('reuse_port', True),
    'gc_off': _gc_off,
    'no_keepalive': lambda: _option('keepalive', 0),
    'balanced_accept': _balanced_accept,
    'workers2': lambda: _option('workers', 2),
    'workers8': lambda: _option('workers', 8),
}


def main():
    variant, rest = sys.argv[1], sys.argv[2:]
    if variant not in VARIANTS:
        raise SystemExit('poll_variant: one of %s' % ', '.join(VARIANTS))
    VARIANTS[variant]()
    import aijob  # noqa: PLC0415 (after the variant's change, as `python aijob.py web` would)

    return aijob.main(['web'] + rest)


if __name__ == '__main__':
    sys.exit(main())
