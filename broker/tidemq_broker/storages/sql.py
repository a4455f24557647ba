"""The SQLAlchemy Core storage shared by the MySQL and SQLite implementations.

Dialect-specific statements (the batch lock, duplicate-ignoring inserts, id recovery, error
classification) are hooks that the subclasses fill in.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Sequence, TypeVar

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, OperationalError

from .. import clock
from ..errors import StorageUnavailableError
from ..schema import message as m
from ..schema import metadata, schema_version, topic as t, SCHEMA_VERSION
from ..storage import (
    AckItem,
    AckOutcome,
    Backoff,
    MessageFilter,
    NewRow,
    Storage,
    StoredMessage,
    TopicSettings,
)
from .. import trace

__all__ = ["SqlStorage", "new_lease_token"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_CHUNK = 1000  # ids per IN (...) list and rows per maintenance batch


class _SomeStale(Exception):
    """Raised inside an ack's fast path to roll it back when an item's lease was lost."""


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


def to_message(row: Any) -> StoredMessage:
    """Map a full message row to a StoredMessage."""
    values = dict(row._mapping)
    schedule = values.get("retry_schedule")
    values["retry_schedule"] = json.loads(schedule) if schedule else None
    return StoredMessage(**values)


class SqlStorage(Storage):
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

    def _lock_update(self, conn: Connection, topic: str, rank: int, total: int, limit: int, sets: dict[str, Any], now: datetime) -> None:
        """The one conditional UPDATE of a batch lock."""
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
            if conn.execute(select(schema_version.c.version).where(schema_version.c.version == SCHEMA_VERSION)).first() is None:
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
    def _lease_sets(self, ttr: int, consumer: str, now: datetime, trace_line: str) -> dict[str, Any]:
        return {
            "status": "RUNNING",
            "lease_token": new_lease_token(),
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

    def lock_batch(self, topic: str, rank: int, total: int, limit: int, ttr: int, consumer: str, now: datetime, trace_line: str) -> list[StoredMessage]:
        sets = self._lease_sets(ttr, consumer, now, trace_line)

        def work(conn: Connection) -> list[StoredMessage]:
            self._lock_update(conn, topic, rank, total, limit, sets, now)
            return self._by_token(conn, sets["lease_token"])

        return self._tx(work)

    def _by_token(self, conn: Connection, token: str) -> list[StoredMessage]:
        rows = conn.execute(select(m).where(m.c.lease_token == token).order_by(m.c.effect_time, m.c.id))
        return [to_message(r) for r in rows]

    def lock_serial(self, topic: str, ttr: int, consumer: str, now: datetime, trace_line: str) -> list[StoredMessage]:
        sets = self._lease_sets(ttr, consumer, now, trace_line)

        def work(conn: Connection) -> list[StoredMessage]:
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
            return self._by_token(conn, sets["lease_token"])

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

    # -- ack ---------------------------------------------------------------------------------
    def ack(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
            topics: Callable[[str], TopicSettings], backoff: Backoff) -> list[AckOutcome]:
        if items and all(item.success for item in items) and len({item.id for item in items}) == len(items):
            try:
                return self._tx(lambda conn: self._ack_all_succeeded(conn, items, now, consumer, broker))
            except _SomeStale:
                pass  # rolled back: sort the batch out item by item below
        return self._ack_each(items, now, consumer, broker, topics, backoff)

    def _ack_all_succeeded(self, conn: Connection, items: Sequence[AckItem], now: datetime, consumer: str,
                           broker: str) -> list[AckOutcome]:
        """The common case in one statement per lease token instead of a locking read first.

        A row is marked only while it is RUNNING under the very token the item names (tokens are
        per pulled batch). If any item does not match, the transaction is rolled back and the
        exact path decides each outcome.
        """
        by_token: dict[str, list[int]] = {}
        for item in items:
            by_token.setdefault(item.lease_token, []).append(item.id)
        line = trace.line(now, "SUCCESS", consumer=consumer, broker=broker)
        for token, ids in by_token.items():
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                done = conn.execute(
                    update(m)
                    .where(m.c.id.in_(chunk), m.c.lease_token == token, m.c.status == "RUNNING")
                    .values(status="SUCCESS", finish_time=now, update_time=now, version=m.c.version + 1,
                            trace=m.c.trace + line)
                ).rowcount
                if done != len(chunk):
                    raise _SomeStale()
        return [AckOutcome.APPLIED] * len(items)

    def _ack_each(self, items: Sequence[AckItem], now: datetime, consumer: str, broker: str,
                  topics: Callable[[str], TopicSettings], backoff: Backoff) -> list[AckOutcome]:
        def work(conn: Connection) -> list[AckOutcome]:
            ids = sorted({item.id for item in items})
            # Only the lease tokens are needed to judge the acks: reading (and decoding) whole
            # rows with their data and trace was most of an ack's cost. Failures, the rare
            # case, read their full row below for the retry decision.
            held: dict[int, Optional[str]] = {}
            for start in range(0, len(ids), _CHUNK):
                stmt = (select(m.c.id, m.c.lease_token)
                        .where(m.c.id.in_(ids[start : start + _CHUNK]), m.c.status == "RUNNING").with_for_update())
                held.update((row.id, row.lease_token) for row in conn.execute(stmt))
            outcomes: list[AckOutcome] = []
            succeeded: list[int] = []
            failed: list[AckItem] = []
            for item in items:
                if item.id not in held or held.pop(item.id) != item.lease_token:
                    outcomes.append(AckOutcome.STALE)
                    continue
                outcomes.append(AckOutcome.APPLIED)
                if item.success:
                    succeeded.append(item.id)
                else:
                    failed.append(item)
            if failed:
                rows = conn.execute(select(m).where(m.c.id.in_([item.id for item in failed])))
                full = {row.id: to_message(row) for row in rows}
                for item in failed:
                    msg = full[item.id]
                    self._fail_one(conn, msg, item.error, now, consumer, broker, topics(msg.topic), backoff)
            if succeeded:
                line = trace.line(now, "SUCCESS", consumer=consumer, broker=broker)
                for start in range(0, len(succeeded), _CHUNK):
                    conn.execute(
                        update(m)
                        .where(m.c.id.in_(succeeded[start : start + _CHUNK]), m.c.status == "RUNNING")
                        .values(status="SUCCESS", finish_time=now, update_time=now, version=m.c.version + 1,
                                trace=m.c.trace + line)
                    )
            return outcomes

        return self._tx(work)

    def _fail_one(self, conn: Connection, msg: StoredMessage, error: str, now: datetime, consumer: str,
                  broker: str, settings: TopicSettings, backoff: Backoff) -> None:
        values: dict[Any, Any] = {"update_time": now, "version": m.c.version + 1}
        if msg.retry_remaining > 0:
            delay = backoff(msg, settings)
            values.update(status="NEW", effect_time=clock.after(now, delay), retry_remaining=msg.retry_remaining - 1,
                          lease_token=None, lease_expire=None)
            line = trace.line(now, "RETRY", consumer=consumer, broker=broker, attempt=msg.attempt,
                              next_in=f"{delay:.3f}s", retries_left=msg.retry_remaining - 1, error=error or "failed")
        else:
            values.update(status="FAIL", finish_time=now)
            line = trace.line(now, "FAIL", consumer=consumer, broker=broker, attempt=msg.attempt, error=error or "failed")
        values["trace"] = m.c.trace + line
        conn.execute(update(m).where(m.c.id == msg.id, m.c.status == "RUNNING").values(values))

    def touch(self, id: int, lease_token: str, ttr: int, now: datetime) -> bool:
        stmt = (
            update(m)
            .where(m.c.id == id, m.c.status == "RUNNING", m.c.lease_token == lease_token)
            .values(lease_expire=clock.after(now, ttr), ttr=ttr, update_time=now)
        )
        return self._tx(lambda conn: conn.execute(stmt).rowcount == 1)

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
            expired = list(conn.execute(
                select(m.c.id).where(m.c.status == "RUNNING", m.c.lease_expire < now).order_by(m.c.lease_expire).limit(limit)
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

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        def work(conn: Connection) -> int:
            old = list(conn.execute(
                select(m.c.id).where(m.c.topic == topic, m.c.status == "SUCCESS", m.c.finish_time < before).limit(limit)
            ).scalars())
            if not old:
                return 0
            return conn.execute(delete(m).where(m.c.id.in_(old), m.c.status == "SUCCESS")).rowcount

        return self._tx(work)

    # -- topics ------------------------------------------------------------------------------
    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        def work(conn: Connection) -> None:
            known = set(conn.execute(select(t.c.name).where(t.c.name.in_(list(names)))).scalars())
            missing = sorted(set(names) - known)
            if missing:
                self._insert_topics_ignoring_duplicates(conn, [self._topic_values(TopicSettings(n), now) for n in missing])

        self._tx(work)

    def _insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    @staticmethod
    def _topic_values(s: TopicSettings, now: datetime) -> dict[str, Any]:
        values = dict(vars(s))
        values.update(add_time=now, update_time=now)
        return values

    def topics(self) -> list[TopicSettings]:
        cols = [c for c in t.c if c.name not in ("add_time", "update_time")]
        rows = self._tx(lambda conn: conn.execute(select(*cols).order_by(t.c.name)).all())
        return [TopicSettings(**dict(r._mapping)) for r in rows]

    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        def work(conn: Connection) -> None:
            values = self._topic_values(settings, now)
            if conn.execute(select(t.c.name).where(t.c.name == settings.name)).first() is None:
                conn.execute(insert(t).values(values))
            else:
                values.pop("add_time")
                conn.execute(update(t).where(t.c.name == settings.name).values(values))

        self._tx(work)

    # -- reading -----------------------------------------------------------------------------
    def get_message(self, id: int) -> Optional[StoredMessage]:
        row = self._tx(lambda conn: conn.execute(select(m).where(m.c.id == id)).first())
        return to_message(row) if row is not None else None

    def list_messages(self, flt: MessageFilter, limit: int, before_id: Optional[int] = None) -> list[StoredMessage]:
        stmt = select(m)
        conds = []
        if flt.topic:
            conds.append(m.c.topic == flt.topic)
        if flt.status:
            conds.append(m.c.status == flt.status)
        if flt.id is not None:
            conds.append(m.c.id == flt.id)
        if flt.unique_key:
            conds.append(m.c.unique_key == flt.unique_key)
        if flt.effect_from:
            conds.append(m.c.effect_time >= flt.effect_from)
        if flt.effect_to:
            conds.append(m.c.effect_time < flt.effect_to)
        if flt.added_from:
            conds.append(m.c.add_time >= flt.added_from)
        if flt.added_to:
            conds.append(m.c.add_time < flt.added_to)
        if flt.text:
            conds.append(m.c.data.contains(flt.text, autoescape=True))
        if before_id is not None:
            conds.append(m.c.id < before_id)
        stmt = stmt.where(*conds).order_by(m.c.id.desc()).limit(limit)
        return [to_message(r) for r in self._tx(lambda conn: conn.execute(stmt).all())]

    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        stmt = select(m.c.topic, m.c.status, func.count()).group_by(m.c.topic, m.c.status)
        if topic:
            stmt = stmt.where(m.c.topic == topic)
        counts: dict[str, dict[str, int]] = {}
        for name, status, n in self._tx(lambda conn: conn.execute(stmt).all()):
            counts.setdefault(name, {})[status] = n
        return counts
