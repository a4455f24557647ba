"""Every SQL statement the pipeline sends to MySQL itself (Spark's JDBC reads aside).

Table and column names come from ``tidemq.tables`` and message states from ``tidemq.lifecycle``
(the pipeline does not import the broker, which builds its schema from the same names).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Iterable, Optional, Sequence

from tidemq.lifecycle import ARCHIVABLE_STATUSES, DEFAULT_RETENTION_DAYS, MessageStatus, retention_deletes_success
from tidemq.tables import ALARM, ARCHIVE_BATCH, MESSAGE, TOPIC, TOPIC_STATS

__all__ = [
    "BatchState", "TopicRow", "Cutoffs", "BatchRow", "status_in", "db_now", "try_lock", "topics",
    "eligible_bounds", "partition_counts", "open_batches", "start_batch", "set_batch_state", "delete_range",
    "upsert_stats", "open_alarms", "insert_alarm", "resolve_alarm", "insert_messages",
]

M, B, A = MESSAGE, ARCHIVE_BATCH, ALARM
_SAFE = re.compile(r"^[A-Za-z0-9._:-]+$")


class BatchState(str, enum.Enum):
    """An archive batch's manifest state: PENDING (Parquet being written) -> WRITTEN (verified)
    -> DONE (its rows deleted from MySQL)."""

    PENDING = "PENDING"
    WRITTEN = "WRITTEN"
    DONE = "DONE"


def _literal(value: str) -> str:
    """A SQL string literal; topic names are validated on produce, but the pipeline still quotes."""
    if _SAFE.match(value):
        return f"'{value}'"
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def status_in(statuses: Iterable[MessageStatus]) -> str:
    """The SQL condition ``status IN (...)`` for ``statuses``."""
    return f"{M.status} IN ({', '.join(_literal(s.value) for s in statuses)})"


@dataclass(frozen=True)
class TopicRow:
    """The settings of one topic the pipeline uses."""

    name: str
    retention_days: int
    alarm_backlog: Optional[int]
    alarm_failure_rate: Optional[float]
    alarm_due_age: Optional[int]
    archive: bool = False

    @property
    def broker_deletes_success(self) -> bool:
        """The broker's retention job deletes this topic's SUCCESS rows itself (the lifecycle's
        rule; the archive takes the others)."""
        return retention_deletes_success(self.retention_days, self.archive)


@dataclass(frozen=True)
class Cutoffs:
    """Which finished messages are old enough to archive: finish_time < cutoff of their topic.

    Fixed once per batch and stored with it, so a rerun after a crash deletes exactly the rows
    the batch selected: a message can leave this set (a dead letter requeued) but never join it,
    because every cutoff lies in the past."""

    default: datetime
    topics: dict[str, datetime]
    # Topics whose SUCCESS rows the broker's retention deletes: only their FAIL rows are
    # archived, so the archive and the broker never race for a row.
    success_by_broker: tuple[str, ...] = ()

    @classmethod
    def compute(cls, now: datetime, settings: Iterable[TopicRow], min_age: float) -> "Cutoffs":
        def cut(days: int) -> datetime:
            # retention_days 0 means "the broker keeps it, the archive moves it": archive once
            # finished; min_age keeps messages finished seconds ago (and clock skew) out.
            return (now - timedelta(days=max(days, 0), seconds=min_age)).replace(
                microsecond=now.microsecond // 1000 * 1000)

        settings = list(settings)
        return cls(cut(DEFAULT_RETENTION_DAYS), {row.name: cut(row.retention_days) for row in settings},
                   tuple(sorted(row.name for row in settings if row.broker_deletes_success)))

    def to_json(self) -> str:
        return json.dumps({"default": self.default.isoformat(),
                           "topics": {k: v.isoformat() for k, v in self.topics.items()},
                           "success_by_broker": list(self.success_by_broker)})

    @classmethod
    def from_json(cls, text: str) -> "Cutoffs":
        raw = json.loads(text)
        return cls(datetime.fromisoformat(raw["default"]),
                   {k: datetime.fromisoformat(v) for k, v in raw["topics"].items()},
                   tuple(raw.get("success_by_broker", ())))

    def predicate(self) -> str:
        """The SQL condition selecting archivable rows."""
        fmt = "%Y-%m-%d %H:%M:%S.%f"
        cases = " ".join(f"WHEN {_literal(t)} THEN '{c.strftime(fmt)}'" for t, c in sorted(self.topics.items()))
        default = f"'{self.default.strftime(fmt)}'"
        cutoff = f"CASE {M.topic} {cases} ELSE {default} END" if cases else default
        statuses = status_in(ARCHIVABLE_STATUSES)
        if self.success_by_broker:
            kept = ", ".join(_literal(t) for t in self.success_by_broker)
            others = [s for s in ARCHIVABLE_STATUSES if s is not MessageStatus.SUCCESS]
            success = f"{M.status} = {_literal(MessageStatus.SUCCESS.value)} AND {M.topic} NOT IN ({kept})"
            statuses = f"({status_in(others)} OR ({success}))"
        return f"{statuses} AND {M.finish_time} IS NOT NULL AND {M.finish_time} < {cutoff}"


@dataclass(frozen=True)
class BatchRow:
    """One archive batch: the ids [id_from, id_to) that match its cutoffs."""

    id: int
    id_from: int
    id_to: int
    cutoffs: Cutoffs
    state: BatchState
    expected_rows: int


def db_now(conn) -> datetime:
    """The database's UTC time (one clock for every cutoff, whatever the job host's clock says)."""
    with conn.cursor() as cur:
        cur.execute("SELECT UTC_TIMESTAMP(3)")
        return cur.fetchone()[0]


def try_lock(conn, name: str) -> bool:
    """Take a named lock held by this connection (released when it closes, also on kill -9)."""
    with conn.cursor() as cur:
        cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
        return cur.fetchone()[0] == 1


_TOPIC_COLUMNS = (TOPIC.topic_name, TOPIC.retention_days, TOPIC.alarm_backlog, TOPIC.alarm_failure_rate,
                  TOPIC.alarm_due_age, TOPIC.archive)  # TopicRow's fields, in order


def topics(conn) -> list[TopicRow]:
    """Every configured topic's settings."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(_TOPIC_COLUMNS)} FROM {TOPIC.name}")
        return [TopicRow(*row) for row in cur.fetchall()]


def eligible_bounds(conn, cutoffs: Cutoffs) -> tuple[Optional[int], Optional[int], int]:
    """(smallest id, largest id, count) of the archivable rows."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN({M.id}), MAX({M.id}), COUNT(*) FROM {M.name} WHERE {cutoffs.predicate()}")
        low, high, count = cur.fetchone()
        return low, high, int(count)


def partition_counts(conn, id_from: int, id_to: int, cutoffs: Cutoffs) -> dict[tuple[str, date], int]:
    """Archivable rows in [id_from, id_to) per (topic, day of finish_time)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {M.topic}, DATE({M.finish_time}), COUNT(*) FROM {M.name} "
                    f"WHERE {M.id} >= %s AND {M.id} < %s AND {cutoffs.predicate()} "
                    f"GROUP BY {M.topic}, DATE({M.finish_time})", (id_from, id_to))
        return {(topic, day): int(n) for topic, day, n in cur.fetchall()}


def open_batches(conn) -> list[BatchRow]:
    """Batches a previous run started and did not finish, oldest first."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {B.id}, {B.id_from}, {B.id_to}, {B.cutoffs}, {B.state}, {B.expected_rows} "
                    f"FROM {B.name} WHERE {B.state} <> %s ORDER BY {B.id}", (BatchState.DONE.value,))
        return [BatchRow(i, lo, hi, Cutoffs.from_json(c), BatchState(s), int(e))
                for i, lo, hi, c, s, e in cur.fetchall()]


def start_batch(conn, id_from: int, id_to: int, cutoffs: Cutoffs, expected: int, path: str, now: datetime) -> BatchRow:
    """Record a new PENDING batch in the manifest."""
    columns = (B.id_from, B.id_to, B.cutoffs, B.path, B.state, B.expected_rows, B.started_at)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {B.name} ({', '.join(columns)}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (id_from, id_to, cutoffs.to_json(), path, BatchState.PENDING.value, expected, now))
        return BatchRow(cur.lastrowid, id_from, id_to, cutoffs, BatchState.PENDING, expected)


def set_batch_state(conn, batch_id: int, state: BatchState, now: datetime, written: Optional[int] = None,
                    deleted: Optional[int] = None, expected: Optional[int] = None) -> None:
    """Move a batch to WRITTEN (Parquet verified) or DONE (rows deleted from MySQL)."""
    with conn.cursor() as cur:
        cur.execute(
            f"UPDATE {B.name} SET {B.state} = %s, {B.written_rows} = COALESCE(%s, {B.written_rows}), "
            f"{B.deleted_rows} = COALESCE(%s, {B.deleted_rows}), {B.expected_rows} = COALESCE(%s, {B.expected_rows}), "
            f"{B.finished_at} = IF(%s, %s, {B.finished_at}) WHERE {B.id} = %s",
            (state.value, written, deleted, expected, state is BatchState.DONE, now, batch_id))


def delete_range(conn, id_from: int, id_to: int, cutoffs: Cutoffs) -> int:
    """Delete the archivable rows in [id_from, id_to) in one transaction; return how many."""
    with conn.cursor() as cur:
        cur.execute(f"DELETE FROM {M.name} WHERE {M.id} >= %s AND {M.id} < %s AND {cutoffs.predicate()}",
                    (id_from, id_to))
        return cur.rowcount


def upsert_stats(conn, rows: Sequence[dict[str, Any]], chunk: int = 1000) -> int:
    """Write one row per (topic, hour), replacing what an earlier run computed."""
    columns = TOPIC_STATS.columns()
    key = (TOPIC_STATS.topic, TOPIC_STATS.hour)
    updates = ", ".join(f"{c} = VALUES({c})" for c in columns if c not in key)
    sql = (f"INSERT INTO {TOPIC_STATS.name} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))}) "
           f"ON DUPLICATE KEY UPDATE {updates}")
    with conn.cursor() as cur:
        for start in range(0, len(rows), chunk):
            cur.executemany(sql, [tuple(row[c] for c in columns) for row in rows[start:start + chunk]])
    return len(rows)


def open_alarms(conn) -> dict[tuple[str, str], int]:
    """(topic, kind) -> id of each alarm raised and not yet resolved."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {A.topic}, {A.kind}, MAX({A.id}) FROM {A.name} WHERE {A.resolved_at} IS NULL "
                    f"GROUP BY {A.topic}, {A.kind}")
        return {(topic, kind): alarm_id for topic, kind, alarm_id in cur.fetchall()}


def insert_alarm(conn, topic: str, kind: str, value: float, threshold: float, message: str, now: datetime) -> int:
    """Record a raised alarm; return its id."""
    columns = (A.topic, A.kind, A.value, A.threshold, A.message, A.raised_at)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {A.name} ({', '.join(columns)}) VALUES (%s, %s, %s, %s, %s, %s)",
                    (topic, kind, value, threshold, message[:1000], now))
        return cur.lastrowid


def resolve_alarm(conn, alarm_id: int, now: datetime) -> None:
    """Mark an alarm resolved (once)."""
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {A.name} SET {A.resolved_at} = %s WHERE {A.id} = %s AND {A.resolved_at} IS NULL",
                    (now, alarm_id))


def insert_messages(conn, rows: Sequence[dict[str, Any]]) -> int:
    """Insert whole message rows (ids kept) in one transaction; rows whose id or (topic,
    unique_key) is taken are skipped, so restoring twice is harmless. Returns rows inserted.

    The rows' keys name the columns written (all rows alike): a row read from an archive written
    before a column existed lacks it, and the table's default fills it."""
    if not rows:
        return 0
    columns = [c for c in M.columns() if c in rows[0]]
    marks = ", ".join(["%s"] * len(columns))
    with conn.cursor() as cur:
        inserted = cur.executemany(f"INSERT IGNORE INTO {M.name} ({', '.join(columns)}) VALUES ({marks})",
                                   [tuple(row[c] for c in columns) for row in rows])
    conn.commit()
    return int(inserted or 0)
