"""The floor for the status GET (issue 9, item 5): a bare bottle app under gunicorn with the same
settings ``python aijob.py web`` uses (``engine.server.gunicorn_options``: the gevent worker
class, the same worker connections, keep-alive and timeouts, and the standard library patched
for gevent before anything is imported, as aijob.py does), answering ``GET /job/<id>``
with one primary-key read of ``ai_job`` through pymysql on a connection taken from a per-process
pool of idle connections (as the engine's store does, without TLS to a loopback server), and the
row as JSON; its workers freeze what they loaded, as the engine's do. No auth, no ORM, no
artifact query: what a status read cannot go below on this stack.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_bench \\
        python benchmarks/poll_floor.py --port 8100 --workers 4

``--sync`` serves it with gunicorn's ``sync`` worker class instead (one request at a time per
process, nothing patched, no keep-alive): the floor issue 34 quotes for the status GET's p99.
"""

import sys

if '--sync' not in sys.argv:
    from gevent import monkey

    monkey.patch_all(aggressive=False)  # first, as aijob.py does for serve and web

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from urllib.parse import unquote, urlsplit  # noqa: E402

import bottle  # noqa: E402
import pymysql  # noqa: E402
from gunicorn.app.base import BaseApplication  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.logs import configure as configure_logging  # noqa: E402
from engine.core.store import LOOPBACK_HOSTS  # noqa: E402
from engine.extensions import load_config  # noqa: E402
from engine.server import gunicorn_options  # noqa: E402

QUERY = 'SELECT * FROM ai_job WHERE id = %s'


def connect_args(database_url):
    parts = urlsplit(database_url)
    if parts.scheme not in ('mysql', 'mariadb'):
        raise SystemExit('poll_floor: AIJOB_DATABASE_URL must name MySQL/MariaDB')
    host = parts.hostname or '127.0.0.1'
    return {
        'host': host,
        'port': parts.port or 3306,
        'user': unquote(parts.username or 'root'),
        'password': unquote(parts.password or ''),
        'database': parts.path.strip('/'),
        'charset': 'utf8mb4',
        'autocommit': True,
        # As the engine's store: no TLS to a loopback server. PyMySQL's default builds an SSL
        # context per connection (~25 ms of CPU), which the floor's pool paid while it grew.
        'ssl_disabled': host in LOOPBACK_HOSTS,
    }


def _json_default(value):
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


def create_floor_app(database_url):
    args = connect_args(database_url)
    idle = []  # this process's open connections not in use (a greenlet takes one per request)
    app = bottle.Bottle()

    @app.get('/job/<job_id>')
    def get_job(job_id):
        conn = idle.pop() if idle else pymysql.connect(**args)
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute(QUERY, (job_id,))
                row = cur.fetchone()
        except pymysql.MySQLError:
            conn.close()  # a broken connection is not handed back
            raise
        idle.append(conn)
        if row is None:
            bottle.response.status = 404
            row = {'error': 'not found'}
        bottle.response.content_type = 'application/json'
        return json.dumps(row, default=_json_default)

    return app


class FloorGunicorn(BaseApplication):
    def __init__(self, database_url, options):
        self.database_url = database_url
        self.options = options
        super().__init__()

    def load_config(self):
        for name, value in self.options.items():
            self.cfg.set(name, value)
        self.cfg.set('proc_name', 'aijob-poll-floor')

    def load(self):
        app = create_floor_app(self.database_url)
        gc.freeze()  # as the engine's workers do once their app is built (server.py)
        return app


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=8100)
    parser.add_argument('--workers', type=int, help='default AIJOB_WEB_WORKERS, as `web`')
    parser.add_argument('--sync', action='store_true', help="gunicorn's sync workers")
    args = parser.parse_args(argv)
    config = load_config()
    configure_logging()
    options = gunicorn_options(config, args.host, args.port, args.workers or config.web_workers)
    if args.sync:
        options['worker_class'] = 'sync'
    FloorGunicorn(config.database_url, options).run()


if __name__ == '__main__':
    main()
