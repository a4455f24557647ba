"""SQLite: the embedded default for ``tidemq dev`` and fast unit tests (one process)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from sqlalchemy import Connection, Engine, create_engine, event, insert, make_url, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..schema import login_failure
from ..schema import message as m
from ..schema import topic as t
from ..errors import ConfigurationError
from .dialect import CallerTransaction, SqlDialect


__all__ = ["SqliteDialect"]

_ROWS_PER_STATEMENT = 500  # 19 columns each: stays under SQLite's 32766 variables
# A keyed insert does nothing on a conflict of any unique key (no conflict target named): a
# database made before version 14 keeps its (topic, unique_key) constraint beside version 14's
# (unique_key, keyed_topic) index (SQLite cannot drop a table's constraint without copying the
# table); the two say the same, and a key taken may trip either first.


class SqliteDialect(SqlDialect):
    """SQLite in WAL mode; transactions are serialised by the database object's process lock,
    which also makes the rowids of one multi-row INSERT consecutive."""

    single_writer = True

    def create_engine(self, url: str, **options: Any) -> Engine:
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **options)
        _create_private(make_url(url).database)  # once the URL is accepted: a refused one leaves no file

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine

    def insert_plain(self, conn: Connection, values: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for start in range(0, len(values), _ROWS_PER_STATEMENT):
            chunk = values[start : start + _ROWS_PER_STATEMENT]
            last = int(conn.execute(insert(m).values(chunk)).lastrowid)  # the last row's id
            ids.extend(range(last - len(chunk) + 1, last + 1))
        return ids

    def insert_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        for start in range(0, len(values), _ROWS_PER_STATEMENT):
            stmt = sqlite_insert(m).values(values[start : start + _ROWS_PER_STATEMENT])
            conn.execute(stmt.on_conflict_do_nothing())  # any unique key (top of module)

    def insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        conn.execute(sqlite_insert(t).values(values).on_conflict_do_nothing(index_elements=["name"]))

    def insert_failure_keys(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        # The process lock already serialises every transaction: inserting is all there is to do.
        conn.execute(sqlite_insert(login_failure).values(values).on_conflict_do_nothing(index_elements=["key_hash"]))

    def enqueue_keyed(self, tx: CallerTransaction, values: dict[str, Any]) -> Optional[int]:
        tx.execute(sqlite_insert(m).values(values).on_conflict_do_nothing())  # any unique key (top of module)
        _, rows = tx.execute(select(m.c.id).where(m.c.keyed_topic == values["topic"],
                                                  m.c.unique_key == values["unique_key"]))
        return rows[0][0] if rows else None

    def alter_table(self, conn: Connection, table: str, columns: Sequence[str] = (), drop_index: Optional[str] = None,
                    add_index: Optional[str] = None, unique: bool = False) -> None:
        # SQLite adds a generated column as VIRTUAL only (a new table has it STORED): read, the
        # two are alike, and an index on it holds its values either way.
        super().alter_table(conn, table, [column.replace("DATETIME(3)", "DATETIME").replace(") STORED", ") VIRTUAL")
                                          for column in columns], drop_index, add_index, unique)

    def lock_topic_row(self, conn: Connection, topic: str) -> bool:
        """Nothing to lock: the database object's process lock already serialises every transaction."""
        return True


def _create_private(path: Optional[str]) -> None:
    """Create a new database file readable by its owner only (0600): it holds the console's
    password hashes. SQLite gives its -wal and -shm files the database file's mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigurationError(f"cannot create the SQLite database {path}: {exc.strerror}") from None
