"""The development master key of ``serve``: with no AIJOB_CREDENTIAL_MASTER_KEY on the embedded
default, ``serve`` keeps a key of its own in a file beside the SQLite database, so webhooks and
users' provider keys work on a laptop with one command (README "Webhooks and event streams").

The file holds the key as base64 text, readable by its owner only (0600); it is made once and
read again at every later start, so secrets and stored keys survive a restart. Only its path is
ever printed or logged. ``web`` and ``worker`` never make one: in production every process must
share one key, which only the operator can hand out.
"""

import base64
import os

import peewee

from .config import GENERATE_MASTER_KEY, master_key_or_empty
from .errors import ConfigError
from .models import UserModelCredential

SUFFIX = '.master-key'


def dev_key_path(database_url):
    """Where ``serve`` keeps its key for this database URL: beside a SQLite file, or None (a
    server database, or SQLite in memory, has no place of its own for it)."""
    if not database_url.startswith('sqlite:///'):
        return None
    path = database_url[len('sqlite:///') :]
    if not path or path == ':memory:' or path.startswith('file:'):
        return None
    return os.path.abspath(path) + SUFFIX


def load_or_create(path):
    """(the 32-byte key in ``path``, True if made now). The key is written to a file of its own
    and then linked into place, which fails if ``path`` exists: two ``serve`` starting at once
    agree on one key, and nobody ever reads a half-written file. A file that holds no valid key
    stops start-up."""
    if os.path.exists(path):
        return _read(path), False
    text = base64.b64encode(os.urandom(32)).decode('ascii')
    draft = '%s.%d.tmp' % (path, os.getpid())
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, 'w') as handle:
            handle.write(text + '\n')
        os.link(draft, path)
    except FileExistsError:
        return _read(path), False
    finally:
        os.unlink(draft)
    return master_key_or_empty(text), True


def _read(path):
    with open(path) as handle:
        text = handle.read().strip()
    try:
        key = master_key_or_empty(text)
    except ValueError as exc:
        raise ConfigError('the development master key file %s is invalid: %s' % (path, exc))
    if key is None:
        raise ConfigError('the development master key file %s is empty' % path)
    return key


def missing_key_error(needs):
    """The one-line refusal of a ``web`` or ``worker`` that would need the key for ``needs``."""
    return ConfigError(
        'AIJOB_CREDENTIAL_MASTER_KEY is not set, but the store holds %s that need it; set the '
        'same key on every web and worker process. Generate one with: %s'
        % (' and '.join(needs), GENERATE_MASTER_KEY)
    )


def require(config, store, keyed_tables=()):
    """``web`` and ``worker`` (production) refuse to start without a master key when the store
    holds what only the key can serve: users' provider keys (encrypted under it), or the rows of
    ``keyed_tables`` ((what, model) pairs, the hook point of engine/core/extension.py: webhook
    endpoints, whose deliveries are signed with secrets derived from it). Started anyway, such a
    process would answer 503 or fail those jobs and deliveries one by one, long after the mistake. A
    store that cannot be read yet (down, or no schema before ``initdb``) is not judged here: its
    requests answer 503 until it can be."""
    if config.credential_master_key is not None:
        return
    try:
        with store.connection():
            needs = [
                name for name, model in _NEEDS_KEY + tuple(keyed_tables) if model.select().exists()
            ]
    except (peewee.DatabaseError, peewee.InterfaceError):
        return
    if needs:
        raise missing_key_error(needs)


_NEEDS_KEY = (("users' provider keys", UserModelCredential),)
