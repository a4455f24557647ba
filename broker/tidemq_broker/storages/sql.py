"""The SQLAlchemy Core storage shared by the MySQL and SQLite implementations.

Dialect-specific statements (the batch lock, duplicate-ignoring inserts, id recovery, error
classification) are hooks that the subclasses fill in.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime
from typing import Any, Callable, Optional, Sequence, TypeVar

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, OperationalError

from .. import clock
from ..errors import StorageUnavailableError
from ..schema import message as m
from ..schema import metadata, schema_version, topic as t, SCHEMA_VERSION
from ..storage import LeasedMessage, NewRow, Storage
from .. import trace
from .sql_acks import SqlAcks
from .sql_migrations import SqlMigrations
from .sql_reads import SqlReads, to_message

__all__ = ["SqlStorage", "new_lease_token", "to_message", "INSERT_COLUMNS"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_CHUNK = 1000  # ids per IN (...) list and rows per maintenance batch
# What a pull reads back of each leased row: the rest of a delivery is what the lock set.
_LEASED_COLUMNS = [m.c.id, m.c.data, m.c.effect_time, m.c.retry_remaining, m.c.attempt]


def new_lease_token() -> str:
    """A fresh, unguessable lease token (32 hex characters)."""
    return uuid.uuid4().hex


def _row_values(row: NewRow, now: datetime, trace_line: str) -> dict[str, Any]:
    return {
        "topic": row.topic,
        "data": row.data,
        "status": "NEW",
        "effect_time": row.effect_time,
        "order_time": row.effect_time,
        "retry_remaining": row.retry_remaining,
        "retry_schedule": json.dumps(row.retry_schedule) if row.retry_schedule is not None else None,
        "attempt": 0,
        "ttr": None,
        "lease_token": None,
        "lease_expire": None,
        "consumer": None,
        "unique_key": row.unique_key or None,
        "version": 0,
        "trace": trace_line,
        "add_time": now,
        "update_time": now,
        "start_time": None,
        "finish_time": None,
    }


INSERT_COLUMNS = list(_row_values(NewRow("t", "0", datetime(2000, 1, 1), 0), datetime(2000, 1, 1), "").keys())


class SqlStorage(SqlAcks, SqlReads, SqlMigrations, Storage):
    """Storage over a SQLAlchemy engine; subclasses supply the dialect hooks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- hooks -------------------------------------------------------------------------------
    def _insert_plain(self, conn: Connection, values: list[dict[str, Any]]) -> list[int]:
        """Insert rows without unique keys; return their ids in order."""
        raise NotImplementedError

    def _insert_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert rows with unique keys, silently skipping (topic, unique_key) already stored."""
        raise NotImplementedError

    def _lock_update(self, conn: Connection, topic: str, rank: int, total: int, limit: int, sets: dict[str, Any],
                     now: datetime) -> None:
        """The one conditional UPDATE of a batch lock: up to ``limit`` due NEW rows of the shard,
        oldest due first, get ``sets`` (see ``_apply_lease_values``)."""
        raise NotImplementedError

    def _is_transient(self, exc: DBAPIError) -> bool:
        """True for deadlocks and lock-wait timeouts: the transaction may simply be retried."""
        return False

    def _lock_topic_row(self, conn: Connection, topic: str) -> None:
        """Serialise serial locks of one topic (a row lock on its topic row)."""
        conn.execute(select(t.c.name).where(t.c.name == topic).with_for_update())

    # -- transactions ------------------------------------------------------------------------
    def _tx(self, work: Callable[[Connection], T], attempts: int = 6) -> T:
        for attempt in range(1, attempts + 1):
            try:
                with self.engine.begin() as conn:
                    return work(conn)
            except DBAPIError as exc:
                if self._is_transient(exc) and attempt < attempts:
                    time.sleep(0.005 * attempt)
                    continue
                if isinstance(exc, OperationalError) or exc.connection_invalidated:
                    raise StorageUnavailableError(f"the database is unavailable: {exc.orig!r}") from exc
                raise
        raise AssertionError("unreachable")

    # -- lifecycle ---------------------------------------------------------------------------
    def create_schema(self) -> None:
        try:
            metadata.create_all(self.engine)
        except DBAPIError:
            # Another broker created the tables between our check and our CREATE.
            metadata.create_all(self.engine)

        def record(conn: Connection) -> None:
            # Only a new database is at the current version by creation: an older schema keeps
            # its version until `tidemq db upgrade` has applied the steps.
            if conn.execute(select(schema_version.c.version).limit(1)).first() is None:
                conn.execute(insert(schema_version).values(version=SCHEMA_VERSION, applied_at=clock.now()))

        self._tx(record)

    def drop_schema(self) -> None:
        metadata.drop_all(self.engine)

    def truncate(self) -> None:
        def work(conn: Connection) -> None:
            for table in reversed(metadata.sorted_tables):
                if table is not schema_version:
                    conn.execute(delete(table))

        self._tx(work)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        self._tx(lambda conn: conn.execute(select(1)).scalar())

    # -- produce -----------------------------------------------------------------------------
    def insert_messages(self, rows: Sequence[NewRow], now: datetime, trace_line: str) -> list[int]:
        plain = [i for i, r in enumerate(rows) if not r.unique_key]
        keyed = [i for i, r in enumerate(rows) if r.unique_key]

        def work(conn: Connection) -> list[int]:
            ids: list[int] = [0] * len(rows)
            if plain:
                new_ids = self._insert_plain(conn, [_row_values(rows[i], now, trace_line) for i in plain])
                for i, new_id in zip(plain, new_ids):
                    ids[i] = new_id
            if keyed:
                self._insert_ignoring_duplicates(conn, [_row_values(rows[i], now, trace_line) for i in keyed])
                found = self._ids_by_unique_key(conn, [(rows[i].topic, rows[i].unique_key or "") for i in keyed])
                for i in keyed:
                    ids[i] = found[(rows[i].topic, rows[i].unique_key or "")]
            return ids

        return self._tx(work)

    def _ids_by_unique_key(self, conn: Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        by_topic: dict[str, set[str]] = {}
        for topic_name, key in keys:
            by_topic.setdefault(topic_name, set()).add(key)
        for topic_name, key_set in by_topic.items():
            key_list = sorted(key_set)
            for start in range(0, len(key_list), _CHUNK):
                chunk = key_list[start : start + _CHUNK]
                stmt = select(m.c.id, m.c.unique_key).where(m.c.topic == topic_name, m.c.unique_key.in_(chunk))
                for row in conn.execute(stmt):
                    found[(topic_name, row.unique_key)] = row.id
        return found

    # -- pull --------------------------------------------------------------------------------
    def _lease_sets(self, ttr: int, consumer: str, now: datetime, trace_line: str,
                    lease_token: Optional[str] = None) -> dict[str, Any]:
        return {
            "status": "RUNNING",
            "lease_token": lease_token or new_lease_token(),
            "lease_expire": clock.after(now, ttr),
            "ttr": ttr,
            "consumer": consumer[:255],
            "start_time": now,
            "update_time": now,
            "trace_line": trace_line,
        }

    def _apply_lease_values(self, sets: dict[str, Any]) -> dict[Any, Any]:
        values = {k: v for k, v in sets.items() if k != "trace_line"}
        values["attempt"] = m.c.attempt + 1
        values["version"] = m.c.version + 1
        values["trace"] = m.c.trace + sets["trace_line"]
        return values

    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime,
                   trace_line: str, lease_token: Optional[str] = None) -> list[LeasedMessage]:
        sets = self._lease_sets(ttr, consumer, now, trace_line, lease_token)

        def work(conn: Connection) -> list[LeasedMessage]:
            self._lock_update(conn, topic, rank, total, limit, sets, now)
            return self._leased(conn, topic, sets)

        return self._tx(work)

    def _leased(self, conn: Connection, topic: str, sets: dict[str, Any]) -> list[LeasedMessage]:
        """The rows of ``topic`` this transaction just leased with ``sets``, oldest due first.

        They are one range of (topic, status, lease_expire): RUNNING with this lease's own
        expiry time, and the token picks ours among any other lease of the same millisecond.
        No index on lease_token is kept for this.
        """
        rows = conn.execute(
            select(*_LEASED_COLUMNS)
            .where(m.c.topic == topic, m.c.status == "RUNNING", m.c.lease_expire == sets["lease_expire"],
                   m.c.lease_token == sets["lease_token"])).all()
        # Sorted here, not by the database: the range comes in id order, and a filesort of the
        # rows with their data cost MariaDB more than this costs Python.
        rows.sort(key=lambda row: (row.effect_time, row.id))
        return [LeasedMessage(row.id, topic, row.data, "RUNNING", row.effect_time, row.retry_remaining, row.attempt,
                              sets["ttr"], sets["lease_token"], sets["consumer"]) for row in rows]

    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, trace_line: str,
                    lease_token: Optional[str] = None) -> list[LeasedMessage]:
        sets = self._lease_sets(ttr, consumer, now, trace_line, lease_token)

        def work(conn: Connection) -> list[LeasedMessage]:
            self._lock_topic_row(conn, topic)
            running = conn.execute(select(m.c.id).where(m.c.topic == topic, m.c.status == "RUNNING").limit(1)).first()
            if running is not None:
                return []
            head = conn.execute(
                select(m.c.id, m.c.effect_time)
                .where(m.c.topic == topic, m.c.status == "NEW")
                .order_by(m.c.order_time, m.c.id)
                .limit(1)
            ).first()
            if head is None or head.effect_time > now:
                return []
            conn.execute(update(m).where(m.c.id == head.id, m.c.status == "NEW").values(self._apply_lease_values(sets)))
            return self._leased(conn, topic, sets)

        return self._tx(work)

    def next_due(self, topic: str, rank: int, total: int) -> Optional[datetime]:
        stmt = select(m.c.effect_time).where(m.c.topic == topic, m.c.status == "NEW")
        if total > 1:
            stmt = stmt.where(m.c.id % total == rank)
        stmt = stmt.order_by(m.c.effect_time).limit(1)
        return self._tx(lambda conn: conn.execute(stmt).scalar())

    def earliest_new(self, topics: Sequence[str]) -> dict[str, datetime]:
        if not topics:
            return {}
        stmt = (select(m.c.topic, func.min(m.c.effect_time))
                .where(m.c.topic.in_(list(topics)), m.c.status == "NEW").group_by(m.c.topic))
        return {name: when for name, when in self._tx(lambda conn: conn.execute(stmt).all())}

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        def work(conn: Connection) -> Optional[datetime]:
            if conn.execute(select(m.c.id).where(m.c.topic == topic, m.c.status == "RUNNING").limit(1)).first():
                return None
            return conn.execute(select(m.c.effect_time).where(m.c.topic == topic, m.c.status == "NEW")
                                .order_by(m.c.order_time, m.c.id).limit(1)).scalar()

        return self._tx(work)

    def max_id(self) -> int:
        return self._tx(lambda conn: conn.execute(select(func.max(m.c.id))).scalar() or 0)

    # -- managing --------------------------------------------------------------------------
    def cancel(self, ids: Sequence[int], now: datetime) -> list[bool]:
        def work(conn: Connection) -> list[bool]:
            wanted = sorted(set(ids))
            pending = set(conn.execute(
                select(m.c.id).where(m.c.id.in_(wanted), m.c.status == "NEW").with_for_update()
            ).scalars())
            if pending:
                conn.execute(delete(m).where(m.c.id.in_(sorted(pending)), m.c.status == "NEW"))
            return [i in pending for i in ids]

        return self._tx(work)

    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime, trace_line: str) -> int:
        moved = 0
        while True:
            def work(conn: Connection) -> int:
                stmt = select(m.c.id).where(m.c.status == "FAIL")
                stmt = stmt.where(m.c.id.in_(list(ids))) if ids else stmt.where(m.c.topic == topic)
                chunk = list(conn.execute(stmt.order_by(m.c.id).limit(_CHUNK)).scalars())
                if not chunk:
                    return 0
                return conn.execute(
                    update(m).where(m.c.id.in_(chunk), m.c.status == "FAIL").values(
                        status="NEW", effect_time=now, retry_remaining=max(retry, 0), finish_time=None,
                        lease_token=None, lease_expire=None, update_time=now, version=m.c.version + 1,
                        trace=m.c.trace + trace_line)
                ).rowcount

            done = self._tx(work)
            moved += done
            if done == 0 or ids:
                return moved

    # -- maintenance -------------------------------------------------------------------------
    def expire_leases(self, now: datetime, limit: int, broker: str) -> int:
        def work(conn: Connection) -> int:
            topics = self.topics_present(conn)
            if not topics:
                return 0
            # One range of (topic, status, lease_expire) per topic.
            expired = list(conn.execute(
                select(m.c.id).where(m.c.topic.in_(topics), m.c.status == "RUNNING", m.c.lease_expire < now)
                .order_by(m.c.lease_expire).limit(limit)
            ).scalars())
            if not expired:
                return 0
            note = trace.line(now, "LEASE_EXPIRED", broker=broker).rstrip("\n") + " lost_by="
            return conn.execute(
                update(m).where(m.c.id.in_(expired), m.c.status == "RUNNING", m.c.lease_expire < now).values(
                    status="NEW", lease_token=None, lease_expire=None, update_time=now, version=m.c.version + 1,
                    trace=m.c.trace + note + func.coalesce(m.c.consumer, "-") + "\n")
            ).rowcount

        return self._tx(work)

    def topics_present(self, conn: Connection) -> list[str]:
        """Every topic that has messages, from the message table itself (a topic row may be
        missing, and nothing stored may be left out): MySQL answers it by jumping from topic to
        topic along an index that starts with topic."""
        return list(conn.execute(select(m.c.topic).distinct()).scalars())

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        def work(conn: Connection) -> int:
            old = list(conn.execute(
                select(m.c.id).where(m.c.topic == topic, m.c.status == "SUCCESS", m.c.finish_time < before).limit(limit)
            ).scalars())
            if not old:
                return 0
            return conn.execute(delete(m).where(m.c.id.in_(old), m.c.status == "SUCCESS")).rowcount

        return self._tx(work)
