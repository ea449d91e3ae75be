"""aijob: the one entry point — the CLI (``python aijob.py COMMAND``) and ``app`` for gunicorn
(``gunicorn aijob:app``). ``app`` is built on first access, so importing this module opens no
database; each command imports what it needs, so the HTTP client commands (``submit``,
``jobs``) start without loading the engine.

``serve`` and ``web`` run gunicorn's gevent worker, and ``worker`` runs its jobs on greenlets (a
job waiting on a provider call costs a few kilobytes, not a thread). gevent patches the standard
library (sockets, ssl, threading, time) here, before anything of ours or of our dependencies is
imported: patched later, modules that already hold the real ``ssl`` or ``threading.local`` keep
them, which is what gevent's MonkeyPatchWarning is about (and bottle's request state or peewee's
connections would be shared by every greenlet). So this module imports nothing of the engine at
its top."""

import argparse
import sys

# The commands that run on gevent: the two that serve through gunicorn's gevent worker
# (engine/server.py), and the worker, whose jobs are greenlets (engine/dispatch/workers.py).
GEVENT_COMMANDS = ('serve', 'web', 'worker')


def patch_for_gevent(argv):
    """Before any other import: patch the standard library for gevent when the command runs
    on it (the worker class of engine/server.py then leaves it as it is). Not aggressive:
    that would also remove ``select.epoll``, which trio (imported by the OpenAI client's HTTP
    stack) needs to define itself; nothing here ever waits on it."""
    if argv[:1] and argv[0] in GEVENT_COMMANDS:
        from gevent import monkey

        monkey.patch_all(aggressive=False)
        from engine.core import resolver  # gevent's resolver, less a thread per lookup

        resolver.install()


def cmd_initdb(config, args):
    from engine.runtime import Runtime

    runtime = Runtime(config)
    runtime.create_schema()
    print('schema ready on %s' % runtime.store.dialect)


def cmd_config(config, args):
    from engine.core.config import describe
    from engine.extensions import SETTINGS

    print(describe(SETTINGS))


def cmd_worker(config, args):
    from engine.runtime import run_worker_process

    return run_worker_process(config)


def cmd_bench(config, args):
    import os

    from engine.bench import gateway_config, run_bench

    return run_bench(
        gateway_config(os.environ) if args.gateway else config,
        jobs=args.jobs,
        rate=args.rate,
        concurrency=args.concurrency,
        sleep_ms=args.sleep_ms,
        gateway=args.gateway,
        users=args.users,
    )


def bench_args(parser):
    parser.add_argument('--jobs', type=int, default=1000, help='synthetic no-op jobs to run')
    parser.add_argument(
        '--gateway',
        action='store_true',
        help='every gateway guard on: a budget, a rate limit and the response cache (all misses)',
    )
    parser.add_argument(
        '--rate', type=float, default=0, help='create at this many jobs/s (default 0: all at once)'
    )
    parser.add_argument(
        '--concurrency',
        type=int,
        help='ai-interactive worker threads (default AIJOB_INTERACTIVE_CONCURRENCY)',
    )
    parser.add_argument(
        '--sleep-ms',
        type=int,
        default=0,
        help='each job sleeps this long (synthetic input sleepMs; default 0: no-op jobs)',
    )
    parser.add_argument(
        '--users',
        type=int,
        default=0,
        help='spread the jobs over this many users, their admission limits lifted '
        '(default 0: every job its own user)',
    )


def cmd_providers(config, args):
    from engine.features.gateway.providers_cli import check, describe

    for line in describe(config):
        print(line)
    if not args.check:
        return 0
    lines, healthy = check(config)
    print('check (GET /models):')
    for line in lines:
        print('  ' + line)
    return 0 if healthy else 1


def providers_args(parser):
    parser.add_argument(
        '--check', action='store_true', help="ask each provider's GET /models with its key"
    )


def cmd_token(config, args):
    from engine.http.auth import TokenStore
    from engine.runtime import Runtime

    runtime = Runtime(config)
    try:
        with runtime.store.connection():
            tokens = TokenStore(runtime.store)
            if args.token_command == 'create':
                return create_token(tokens, args)
            return revoke_tokens(tokens, args)
    finally:
        runtime.close()


def create_token(tokens, args):
    if (args.user is None) == (args.service is None) or (args.service and args.admin):
        print('aijob: error: give either --user USER [--admin] or --service NAME', file=sys.stderr)
        return 2
    role = 'service' if args.service else 'SUPER_ADMIN' if args.admin else 'user'
    try:
        token = tokens.create(args.service or args.user, role=role)
    except ValueError as exc:
        print('aijob: error: %s' % exc, file=sys.stderr)
        return 2
    what = 'service %s' % args.service if args.service else 'user %s' % args.user
    print('token for %s (role %s); it is shown only once:' % (what, role))
    print(token)
    return 0


def revoke_tokens(tokens, args):
    if (args.token is None) == (args.user is None):
        print('aijob: error: give either a TOKEN or --user USER', file=sys.stderr)
        return 2
    revoked = tokens.revoke(args.token) if args.token else tokens.revoke_user(args.user)
    print('revoked %d token(s)' % int(revoked))
    return 0 if revoked else 1


def token_args(parser):
    sub = parser.add_subparsers(dest='token_command', required=True)
    create = sub.add_parser('create', help='issue a bearer token; the last line printed is it')
    create.add_argument('--user', help='the user id the token acts as')
    create.add_argument('--admin', action='store_true', help='role SUPER_ADMIN')
    create.add_argument(
        '--service',
        help="role service, named NAME: an application's server, which creates jobs for its "
        'users (userId) and reads, follows and cancels them',
    )
    revoke = sub.add_parser('revoke', help='revoke one token, or every token of --user')
    revoke.add_argument('token', nargs='?', help='the token to revoke')
    revoke.add_argument('--user', help='revoke every token of this user')


def cmd_web(config, args):
    from engine.server import run_web

    run_web(config, args.host, args.port or config.port, args.workers or config.web_workers)


def cmd_serve(config, args):
    from engine.server import run_serve

    run_serve(config, args.host, args.port or config.port)


def web_args(parser):
    serve_args(parser)
    parser.add_argument('--workers', type=int, help='worker processes (AIJOB_WEB_WORKERS)')


def serve_args(parser):
    parser.add_argument('--host', default='127.0.0.1', help='address to listen on')
    parser.add_argument('--port', type=int, help='port (default AIJOB_PORT, 8000)')


def cmd_submit(config, args):
    from engine.client import run

    return run('submit', args, config.port)


def cmd_jobs(config, args):
    from engine.client import run

    return run('jobs', args, config.port)


def submit_args(parser):
    from engine.client import submit_args as add

    add(parser)


def jobs_args(parser):
    from engine.client import jobs_args as add

    add(parser)


COMMANDS = {
    # name: (function, help, add_arguments or None)
    'initdb': (cmd_initdb, 'create the schema if missing (safe to run twice)', None),
    'config': (cmd_config, 'list every setting with its default and meaning', None),
    'worker': (
        cmd_worker,
        'run dispatcher, worker pools, reaper and reconciler (needs Redis)',
        None,
    ),
    'token': (cmd_token, 'create or revoke API bearer tokens', token_args),
    'providers': (
        cmd_providers,
        'print the providers, models (limits, prices) and routes, keys masked; --check asks '
        'each provider for its model list',
        providers_args,
    ),
    'web': (
        cmd_web,
        'serve the HTTP API with gunicorn (several workers, no background loops)',
        web_args,
    ),
    'serve': (
        cmd_serve,
        'everything in one process for development: API, dispatcher, workers',
        serve_args,
    ),
    'submit': (
        cmd_submit,
        'create a job on a running server; --wait follows it with a progress bar',
        submit_args,
    ),
    'jobs': (cmd_jobs, 'list recent jobs of a running server as a table', jobs_args),
    'bench': (
        cmd_bench,
        'create N synthetic jobs, run them with one worker process, print figures',
        bench_args,
    ),
}


def build_parser():
    parser = argparse.ArgumentParser(prog='aijob.py', description='aijob: durable AI jobs.')
    sub = parser.add_subparsers(dest='command', required=True)
    for name, (_, help_text, add_arguments) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text)
        if add_arguments is not None:
            add_arguments(command_parser)
    return parser


def main(argv=None):
    from engine.core.errors import AiJobError
    from engine.core.store import OperationalError
    from engine.extensions import load_config

    args = build_parser().parse_args(argv)
    try:
        config = load_config()
        return COMMANDS[args.command][0](config, args) or 0
    except AiJobError as exc:
        print('aijob: error: %s' % exc, file=sys.stderr)
        return 2
    except OperationalError as exc:
        print('aijob: error: the database is unreachable: %s' % exc, file=sys.stderr)
        return 2


_app = None


def __getattr__(name):
    """``aijob:app`` for gunicorn, built from the environment on first access."""
    global _app
    if name != 'app':
        raise AttributeError(name)
    if _app is None:
        from engine.core.logs import configure as configure_logging
        from engine.extensions import load_config
        from engine.http.app import create_app
        from engine.runtime import Runtime

        configure_logging()
        _app = create_app(Runtime(load_config(), role='web'))
    return _app


if __name__ == '__main__':
    patch_for_gevent(sys.argv[1:])
    sys.exit(main())
