"""aijob: the one entry point — the CLI (``python aijob.py COMMAND``) and, later, ``app`` for gunicorn."""
import argparse
import sys

from engine.config import Config, describe
from engine.errors import AiJobError
from engine.runtime import Runtime
from engine.store import OperationalError


def cmd_initdb(config, args):
    runtime = Runtime(config)
    runtime.store.create_schema()
    print('schema ready on %s' % runtime.store.dialect)


def cmd_config(config, args):
    print(describe())


def cmd_worker(config, args):
    from engine.workers import run_worker_process
    return run_worker_process(config)


def cmd_bench(config, args):
    from engine.bench import run_bench
    return run_bench(config, jobs=args.jobs)


def bench_args(parser):
    parser.add_argument('--jobs', type=int, default=1000, help='synthetic no-op jobs to run')


COMMANDS = {
    # name: (function, help, add_arguments or None)
    'initdb': (cmd_initdb, 'create the schema if missing (safe to run twice)', None),
    'config': (cmd_config, 'list every setting with its default and meaning', None),
    'worker': (cmd_worker, 'run dispatcher, worker pools, reaper and reconciler (needs Redis)', None),
    'bench': (cmd_bench, 'create N synthetic jobs, run them with one worker process, print figures',
              bench_args),
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
    args = build_parser().parse_args(argv)
    try:
        config = Config.from_env()
        return COMMANDS[args.command][0](config, args) or 0
    except AiJobError as exc:
        print('aijob: error: %s' % exc, file=sys.stderr)
        return 2
    except OperationalError as exc:
        print('aijob: error: the database is unreachable: %s' % exc, file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
