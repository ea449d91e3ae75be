"""schema.sql (the deployed DDL) and the peewee models describe the same tables (real MariaDB),
the kernel's and each feature's (its models.py and the schema.sql beside it).

The DDL is applied to one database and the models create their tables in another; the two are
then compared through information_schema: columns, types, NULL-ability, unique keys and indexes."""

from urllib.parse import urlsplit

import peewee
import pymysql
import pytest

from engine.core.models import MODELS, database
from engine.core.store import default_schema_path, split_sql
from engine.extensions import load_config
from engine.runtime import Runtime
from tests.support.backends import MYSQL_URL, require_servers

pytestmark = pytest.mark.slow


@pytest.fixture
def mysql():
    require_servers('mysql')
    parts = urlsplit(MYSQL_URL)
    conn = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
        autocommit=True,
    )
    base = parts.path.strip('/')
    names = (base + '_schema_sql', base + '_schema_models')
    with conn.cursor() as cursor:
        for name in names:
            cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
            cursor.execute('CREATE DATABASE `%s` CHARACTER SET utf8mb4' % name)
    yield conn, names
    with conn.cursor() as cursor:
        for name in names:
            cursor.execute('DROP DATABASE IF EXISTS `%s`' % name)
    conn.close()


def describe(conn, schema):
    with conn.cursor() as cursor:
        cursor.execute(
            'SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, EXTRA '
            'FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s',
            (schema,),
        )
        columns = set(cursor.fetchall())
        cursor.execute(
            'SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, '
            'GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) '
            'FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s '
            'GROUP BY TABLE_NAME, INDEX_NAME, NON_UNIQUE',
            (schema,),
        )
        indexes = {
            (t, 'PRIMARY' if name == 'PRIMARY' else 'key', non_unique, cols)
            for t, name, non_unique, cols in cursor.fetchall()
        }
    return columns, indexes


def feature_tables(directory):
    """The Tables the installed features register (core.extension.Tables)."""
    url = 'sqlite:///%s' % (directory / 'features.db')
    runtime = Runtime(load_config({'AIJOB_DATABASE_URL': url}), role='schema-test')
    try:
        return list(runtime.hooks.tables)
    finally:
        runtime.close()


def test_schema_sql_matches_the_models(mysql, tmp_path):
    conn, (sql_db, models_db) = mysql
    features = feature_tables(tmp_path)
    assert features, 'the installed features register no table'
    models = list(MODELS) + [model for tables in features for model in tables.models]
    with conn.cursor() as cursor:
        cursor.execute('USE `%s`' % sql_db)
        for path in [default_schema_path()] + [tables.schema_sql for tables in features]:
            for statement in split_sql(open(path).read()):
                cursor.execute(statement)
    parts = urlsplit(MYSQL_URL)
    model_db = peewee.MySQLDatabase(
        models_db,
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username or 'root',
        password=parts.password or '',
    )
    previous = database.obj
    database.initialize(model_db)
    try:
        model_db.create_tables(models)
    finally:
        model_db.close()
        database.initialize(previous)
    sql_columns, sql_indexes = describe(conn, sql_db)
    model_columns, model_indexes = describe(conn, models_db)
    assert len({c[0] for c in sql_columns}) == len(models)
    assert 'webhook_delivery' in {c[0] for c in sql_columns}  # a feature's own table
    assert sql_columns == model_columns
    assert sql_indexes == model_indexes
    assert any(c[2] == 'datetime(6)' for c in sql_columns)
    assert ('ai_job', 'key', 0, 'user_id,job_type,idempotency_key') in sql_indexes
    assert ('outbox_event', 'key', 0, 'dedupe_key') in sql_indexes
