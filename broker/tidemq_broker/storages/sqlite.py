"""SQLite storage: the embedded default for ``tidemq dev`` and fast unit tests (one process)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection, create_engine, event, insert, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..schema import message as m
from ..schema import topic as t
from .sql import SqlStorage

__all__ = ["SqliteStorage"]

T = TypeVar("T")
_ROWS_PER_STATEMENT = 500  # 19 columns each: stays under SQLite's 32766 variables


class SqliteStorage(SqlStorage):
    """Storage in one SQLite file. Transactions are serialised by a process lock, which also
    makes the rowids of one multi-row INSERT consecutive."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **engine_options)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        super().__init__(engine)
        self._write_lock = threading.RLock()

    def _tx(self, work: Callable[[Connection], T], attempts: int = 6) -> T:
        with self._write_lock:
            return super()._tx(work, attempts)

    def _insert_plain(self, conn: Connection, values: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for start in range(0, len(values), _ROWS_PER_STATEMENT):
            chunk = values[start : start + _ROWS_PER_STATEMENT]
            last = int(conn.execute(insert(m).values(chunk)).lastrowid)  # the last row's id
            ids.extend(range(last - len(chunk) + 1, last + 1))
        return ids

    def _insert_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        for start in range(0, len(values), _ROWS_PER_STATEMENT):
            stmt = sqlite_insert(m).values(values[start : start + _ROWS_PER_STATEMENT])
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["topic", "unique_key"]))

    def _insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        conn.execute(sqlite_insert(t).values(values).on_conflict_do_nothing(index_elements=["name"]))

    def _lock_update(self, conn: Connection, topic: str, rank: int, total: int, limit: int,
                     sets: dict[str, Any], now: datetime) -> None:
        due = select(m.c.id).where(m.c.topic == topic, m.c.status == "NEW", m.c.effect_time <= now)
        if total > 1:
            due = due.where(m.c.id % total == rank)
        due = due.order_by(m.c.effect_time, m.c.id).limit(limit)
        conn.execute(update(m).where(m.c.id.in_(due.scalar_subquery()), m.c.status == "NEW")
                     .values(self._apply_lease_values(sets)))

    def _lock_topic_row(self, conn: Connection, topic: str) -> None:
        """Nothing to do: the process lock already serialises every transaction."""
