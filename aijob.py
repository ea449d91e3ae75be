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


COMMANDS = {
    'initdb': (cmd_initdb, 'create the schema if missing (safe to run twice)'),
    'config': (cmd_config, 'list every setting with its default and meaning'),
}


def build_parser():
    parser = argparse.ArgumentParser(prog='aijob.py', description='aijob: durable AI jobs.')
    sub = parser.add_subparsers(dest='command', required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        config = Config.from_env()
        COMMANDS[args.command][0](config, args)
    except AiJobError as exc:
        print('aijob: error: %s' % exc, file=sys.stderr)
        return 2
    except OperationalError as exc:
        print('aijob: error: the database is unreachable: %s' % exc, file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
