"""Transactional enqueue: one message inserted inside the caller's own open transaction.

The application hands over its connection (a SQLAlchemy ``Connection``, or a DB-API connection
such as PyMySQL's) with a transaction open; every statement here runs in that transaction and
nothing here commits or rolls back, so the message exists exactly when the caller commits.

The statements are the produce path's, one row at a time: the row comes from ``row_values``
with the lifecycle's ``produce`` change, and a unique key dedupes as in ``Writes.insert_messages``.
A keyed row is the dialect's (``SqlDialect.enqueue_keyed``): on MySQL
``ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id)``, so a repeat answers the existing id in the
same round trip, and InnoDB takes an exclusive lock on the key, so a second transaction
enqueuing the same key waits until the first one ends (then gets its id, or inserts if it rolled
back) instead of storing a duplicate.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from sqlalchemy import Connection, insert, select
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.expression import Executable

from tidemq import lifecycle
from tidemq.errors import ConfigurationError

from ..schema import message as m
from ..schema import topic as t
from ..records import NewRow, TopicSettings
from .dialect import CallerTransaction, SqlDialect
from .mysql import MySqlDialect
from .sqlite import SqliteDialect
from .rows import insert_columns, row_values
from .topics import setting_columns

#: The dialect of each SQLAlchemy dialect name enqueue can write for.
_DIALECTS: dict[str, type[SqlDialect]] = {"mysql": MySqlDialect, "sqlite": SqliteDialect}

__all__ = ["CallerTransaction", "SqlAlchemyTransaction", "DbApiTransaction", "topic_settings", "insert_message"]


class SqlAlchemyTransaction:
    """A SQLAlchemy ``Connection`` (a Session's included): statements run through it, so a
    connection that has not begun yet begins here, as any statement of the application would."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        name = conn.dialect.name
        if name not in _DIALECTS:
            raise ConfigurationError(f"enqueue needs MySQL/MariaDB (or SQLite for development), not {name}")
        self.dialect = _DIALECTS[name]()

    def execute(self, stmt: Executable) -> tuple[Optional[int], list[tuple[Any, ...]]]:
        result = self._conn.execute(stmt)
        rows = [tuple(row) for row in result] if result.returns_rows else []
        return result.lastrowid if not result.returns_rows else None, rows


class DbApiTransaction:
    """A plain DB-API connection to MySQL/MariaDB (PyMySQL's ``format`` paramstyle): statements
    are compiled for MySQL and run on a cursor of it."""

    _compiler = mysql.dialect(paramstyle="pyformat")

    def __init__(self, dbapi_connection: Any) -> None:
        self._conn = dbapi_connection
        self.dialect: SqlDialect = MySqlDialect()

    def execute(self, stmt: Executable) -> tuple[Optional[int], list[tuple[Any, ...]]]:
        compiled = stmt.compile(dialect=self._compiler)
        cursor = self._conn.cursor()
        try:
            cursor.execute(str(compiled), compiled.params)
            rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
            return cursor.lastrowid, rows
        finally:
            cursor.close()


def topic_settings(tx: CallerTransaction, topic: str) -> Optional[TopicSettings]:
    """The settings row of ``topic``, or None when it has none yet.

    A plain (non-locking) read: an enqueue takes no lock on the topic row, which serial leases of
    the topic lock, so a long application transaction never holds them up.
    """
    cols = setting_columns()
    _, rows = tx.execute(select(*cols).where(t.c.name == topic))
    return TopicSettings(**dict(zip((c.name for c in cols), rows[0]))) if rows else None


def insert_message(tx: CallerTransaction, row: NewRow, now: datetime, **who: object) -> int:
    """Insert ``row`` as a NEW message in the caller's transaction; return its id.

    A topic without a settings row keeps none: inserting it here would lock the new row until
    the application commits, and every broker that produces to the topic or leases it serially
    would wait for that. Defaults apply to a topic without a row; the brokers create it.

    With a unique key already stored for the topic (or stored by a transaction that commits while
    this one waits on the key), nothing is inserted and the existing message's id is returned.
    """
    values = row_values(row, insert_columns(lifecycle.produce(now, **who)))
    if not row.unique_key:
        new_id, _ = tx.execute(insert(m).values(values))
        return _id(new_id)
    return _id(tx.dialect.enqueue_keyed(tx, values))


def _id(value: Optional[int]) -> int:
    if not value:
        raise AssertionError("the database reported no id for the inserted message")
    return int(value)
