"""The floor for the status GET (issue 9, item 5): a bare bottle app under gunicorn with the same
settings ``python aijob.py web`` uses (``engine.http.server.gunicorn_options``: gthread worker
class, AIJOB_WEB_THREADS threads per worker, the same keep-alive and timeouts), answering
``GET /job/<id>`` with one primary-key read of ``ai_job`` through pymysql, one connection per
thread, and the row as JSON. No auth, no ORM, no artifact query: what a status read cannot go
below on this stack.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/test_bench \\
        python benchmarks/poll_floor.py --port 8100 --workers 4
"""

import argparse
import datetime
import json
import os
import sys
import threading
from urllib.parse import unquote, urlsplit

import bottle
import pymysql
from gunicorn.app.base import BaseApplication

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.core.config import Config  # noqa: E402
from engine.core.logs import configure as configure_logging  # noqa: E402
from engine.http.server import gunicorn_options  # noqa: E402

QUERY = 'SELECT * FROM ai_job WHERE id = %s'


def connect_args(database_url):
    parts = urlsplit(database_url)
    if parts.scheme not in ('mysql', 'mariadb'):
        raise SystemExit('poll_floor: AIJOB_DATABASE_URL must name MySQL/MariaDB')
    return {
        'host': parts.hostname or '127.0.0.1',
        'port': parts.port or 3306,
        'user': unquote(parts.username or 'root'),
        'password': unquote(parts.password or ''),
        'database': parts.path.strip('/'),
        'charset': 'utf8mb4',
        'autocommit': True,
    }


def _json_default(value):
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


def create_floor_app(database_url):
    args = connect_args(database_url)
    local = threading.local()
    app = bottle.Bottle()

    def cursor():
        conn = getattr(local, 'conn', None)
        if conn is None:
            conn = local.conn = pymysql.connect(**args)
        return conn.cursor(pymysql.cursors.DictCursor)

    @app.get('/job/<job_id>')
    def get_job(job_id):
        try:
            with cursor() as cur:
                cur.execute(QUERY, (job_id,))
                row = cur.fetchone()
        except pymysql.MySQLError:
            local.conn = None  # reconnect on the next request
            raise
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
        return create_floor_app(self.database_url)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--host', default='127.0.0.1')
    parser.add_argument('--port', type=int, default=8100)
    parser.add_argument('--workers', type=int, help='default AIJOB_WEB_WORKERS, as `web`')
    args = parser.parse_args(argv)
    config = Config.from_env()
    configure_logging()
    options = gunicorn_options(config, args.host, args.port, args.workers or config.web_workers)
    FloorGunicorn(config.database_url, options).run()


if __name__ == '__main__':
    main()
