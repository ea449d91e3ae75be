"""Plain SQL for the hot path: the statements every job runs, written once per dialect.

peewee builds a query in tens of microseconds and re-reads rows it could have returned; for the
few statements each job runs (create, lock, progress, finish, publish) that cost more than the
database did. A ``Statement`` is the text for MySQL/MariaDB and SQLite, made once at import;
``Store.execute`` sends it on the store's connection (so transactions and statement counting are
peewee's). Everything else stays peewee.

In the text, ``%s`` marks a parameter, ``{now}`` is the database clock (architecture decision 2),
``{now_plus}`` the clock plus a parameter made by ``Store.ms_param`` and ``{today}`` the start of
the clock's UTC day.
"""

import contextlib
import functools
import threading

import peewee

from .models import AiJob, database

_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_CLOCK = {
    'mysql': {
        'now': 'UTC_TIMESTAMP(6)',
        'now_plus': '(UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)',
        'today': 'UTC_DATE()',
    },
    'sqlite': {
        'now': _SQLITE_NOW,
        'now_plus': "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)",
        'today': "date('now')",
    },
}


class Statement:
    """One statement's text per dialect (``sqlite`` only where SQLite needs other words)."""

    def __init__(self, mysql, sqlite=None):
        self.mysql = mysql.format(**_CLOCK['mysql'])
        # The placeholders change before the clock goes in: SQLite's clock has '%' of its own.
        self.sqlite = (sqlite or mysql).replace('%s', '?').format(**_CLOCK['sqlite'])

    def text(self, dialect):
        return self.sqlite if dialect == 'sqlite' else self.mysql


_MADE = {}


def statement(mysql, sqlite=None):
    """The Statement for this text, made once: for statements whose text depends on their
    arguments (an IN list's length, a fence's shape, the columns a write sets)."""
    key = (mysql, sqlite)
    if key not in _MADE:
        _MADE[key] = Statement(mysql, sqlite)
    return _MADE[key]


def dialect_of(db):
    return 'sqlite' if isinstance(db, peewee.SqliteDatabase) else 'mysql'


def execute(statement, params=()):
    """Send ``statement`` on the bound database (the one the models use), in this thread's
    connection and transaction; returns the driver cursor."""
    db = database.obj
    return db.execute_sql(statement.text(dialect_of(db)), params)


def placeholders(count):
    return ', '.join(['%s'] * count)


def job_from_row(columns, row):
    """An AiJob from selected ``columns`` and a driver ``row``, converted as peewee would
    (SQLite returns times as text)."""
    fields = AiJob._meta.fields
    pairs = zip(columns, row, strict=True)
    values = {name: fields[name].python_value(value) for name, value in pairs}
    return AiJob(__no_default__=True, **values)


# ---------------------------------------------------------------- rows written together
# A write of one row per call, or, inside ``rows_together()``, kept until the block ends and
# then written with the other rows of the same statement: one multi-row INSERT (or UPDATE) each.
# The statements of a block's end go to MySQL/MariaDB in one round trip (``send``).
ROWS_PER_INSERT = 500  # a bound on one statement's size and parameter count
_IGNORE_DUPLICATE = {
    'mysql': ' ON DUPLICATE KEY UPDATE id = id',
    'sqlite': ' ON CONFLICT DO NOTHING',
}
_together = threading.local()


def write_row(shape, row, plan, last=False):
    """``plan(rows)`` plans the write of rows of one statement ``shape`` (any hashable key) as a
    list of ``(Statement, params, receive)``, ``receive(cursor)`` (or None) taking that
    statement's result (it may raise; it must not send SQL). Here ``plan([row])`` is sent now,
    or, inside a ``rows_together()`` block, with every row of the same shape at the block's
    end (in the order they came).

    ``last``: at the block's end, after the shapes that are not: for writes that lock rows
    other transactions wait for (a user's admission counters), which a transaction holds
    until it ends, so that they are held only through its last statements and COMMIT."""
    pending = getattr(_together, 'rows', None)
    if pending is None:
        send(plan([row]))
    else:
        pending.setdefault(shape, (plan, [], last))[1].append(row)


def insert_row(head, row, params, ignore_duplicate=False, returning=None, read_back=False):
    """``head`` (``INSERT INTO t (cols) VALUES ``) with one ``row`` (``(%s, …, {now})``) of
    ``params``; ``ignore_duplicate`` keeps an existing row with the same key (an idempotent
    write). Sent now, or at the end of the enclosing ``rows_together()`` block.

    ``returning`` — ``(columns, key, receive)`` — asks for ``INSERT … RETURNING columns``:
    ``receive(row)`` gets this row's values, matched by the first column, which must be unique
    and equal ``key`` (RETURNING's order is not promised); by the time the statement went out,
    so at once or at the block's end. ``read_back`` (where not ``Store.insert_returns()``,
    MySQL): the same answer from a SELECT of the rows by that column, sent right after the
    INSERT in the same round trip (the transaction reads its own rows)."""
    columns = returning[0] if returning else None
    shape = (head, row, ignore_duplicate, columns, read_back)
    write_row(shape, (params, returning), lambda rows: _plan_inserts(*shape, rows))


@contextlib.contextmanager
def rows_together(ends_transaction=False):
    """Inside a transaction: every ``write_row`` of this thread in the block waits for its
    end, where rows of the same shape go out as one statement (shapes in the order they first
    came, those written ``last`` after the others), and those statements in one round trip. A
    block left by an exception writes nothing of them. A block inside another joins it (and
    its ``ends_transaction`` is the outer block's to say).

    ``ends_transaction``: nothing follows the block's writes in its transaction, which the
    caller began and will commit: on MariaDB/MySQL the COMMIT goes in their round trip
    (``send(…, commit=True)``), so none of their receives may refuse unless a statement of
    theirs fails first on the same condition (lifecycle's guard of a terminal UPDATE)."""
    if getattr(_together, 'rows', None) is not None:
        yield
        return
    _together.rows = {}
    try:
        yield
        pending = _together.rows
        _together.rows = None
        in_order = sorted(pending.values(), key=lambda entry: entry[2])  # stable: `last` ones last
        planned = [planned for plan, rows, _ in in_order for planned in plan(rows)]
        send(planned, commit=ends_transaction and bool(planned))
    finally:
        _together.rows = None


_COMMITTING = (Statement('COMMIT'), (), None)  # planned last by send(…, commit=True)


def send(planned, commit=False):
    """Send ``planned`` statements (``(Statement, params, receive)``) in this thread's
    connection and transaction; returns what each ``receive(cursor)`` returned (None for a
    statement without one). MySQL/MariaDB gets them in one round trip (a multi-statement
    query: the server runs them in order and stops at the first that fails); SQLite, in
    process, one by one. The first exception, of a statement or of a ``receive``, is raised
    once every result has been read (the connection stays usable).

    ``commit``: on MySQL/MariaDB the transaction's COMMIT goes last in the same round trip;
    a failing statement stops the server before it, so the caller's rollback undoes the
    transaction as ever. Only for a transaction that has nothing left to send, whose receives
    never refuse (the COMMIT has run by the time they read their results): refusals must be
    errors of the statements themselves, such as a CHECK constraint, or a receive's refusal
    must come with a statement that fails on the same condition (lifecycle's guard of a
    terminal UPDATE), which stops the server before the COMMIT. The store then takes its
    own COMMIT as done, and refuses any statement before the transaction's end. SQLite, in
    process, commits when the transaction ends, as without it."""
    db = database.obj
    if dialect_of(db) == 'sqlite' or (len(planned) <= 1 and not commit):
        return [_received(receive, execute(made, params)) for made, params, receive in planned]
    if not commit:
        received, failure, _ = _send_together(db, planned)
    else:
        received, failure, every_statement_ran = _send_together(db, planned + [_COMMITTING])
        if every_statement_ran:  # the server committed, whatever an answer said
            db.committed_with_writes()
        if failure is None:
            received.pop()  # the COMMIT's (None)
    if failure is not None:
        raise failure
    return received


def _send_together(db, planned):
    """``planned`` as one multi-statement query. Returns what the receives returned, the first
    failure (of a statement or a receive; after it no answer is taken, but every result is
    read) and whether every statement ran."""
    text = ';\n'.join(made.mysql for made, _, _ in planned)
    cursor = db.execute_sql(text, [value for _, params, _ in planned for value in params])
    db.count_statements(len(planned) - 1)  # one round trip, but every statement counts
    received, failure = [], None
    for i, (_, _, receive) in enumerate(planned):
        if i:
            try:
                _next_result(cursor)
            except Exception as exc:  # this statement failed: the server ran none after it
                return received, failure or exc, False
        if failure is None:
            try:
                received.append(_received(receive, cursor))
            except Exception as exc:  # the rest are read all the same, their answers not taken
                failure = exc
    return received, failure, True


def _received(receive, cursor):
    return None if receive is None else receive(cursor)


def _next_result(cursor):
    """Move ``cursor`` to the next statement's result, a failure raised as peewee's."""
    with peewee.__exception_wrapper__:
        return cursor.nextset()


def _plan_inserts(head, row, ignore_duplicate, columns, read_back, rows):
    """``rows``: (params, returning or None) pairs, planned ROWS_PER_INSERT at a time."""
    planned = []
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        text = head + ', '.join([row] * len(chunk))
        values = [value for params, _ in chunk for value in params]
        receive = functools.partial(_receive_returned, chunk) if columns else None
        if ignore_duplicate:
            made = statement(text + _IGNORE_DUPLICATE['mysql'], text + _IGNORE_DUPLICATE['sqlite'])
        elif columns and read_back:
            planned.append((statement(text), values, None))
            keys = [returning[1] for _, returning in chunk]
            made, values = _read_back(head, columns, len(keys)), keys
        elif columns:
            made = statement(text + ' RETURNING ' + columns)
        else:
            made = statement(text)
        planned.append((made, values, receive))
    return planned


def _read_back(head, columns, count):
    """The SELECT of ``count`` rows just inserted by ``head``, by the first of ``columns``."""
    assert head.startswith('INSERT INTO '), head
    table = head[len('INSERT INTO ') :].split(' ', 1)[0]
    key = columns.split(',', 1)[0].strip()
    return statement(
        'SELECT %s FROM %s WHERE %s IN (%s)' % (columns, table, key, placeholders(count))
    )


def _receive_returned(chunk, cursor):
    receivers = {returning[1]: returning[2] for _, returning in chunk}
    for returned in cursor.fetchall():
        receivers.pop(returned[0])(returned)
    if receivers:
        raise RuntimeError('INSERT … RETURNING left %d rows unanswered' % len(receivers))
