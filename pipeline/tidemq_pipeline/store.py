"""Every SQL statement the pipeline sends to MySQL itself (Spark's JDBC reads aside).

The tables are defined in broker/tidemq_broker/schema.py; the pipeline does not import the
broker, so the column names are repeated here and nowhere else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, Iterable, Optional, Sequence

__all__ = [
    "MESSAGE", "ARCHIVE_BATCH", "TopicRow", "Cutoffs", "BatchRow", "db_now", "try_lock", "topics",
    "eligible_bounds", "partition_counts", "open_batches", "start_batch", "set_batch_state", "delete_range",
    "upsert_stats", "open_alarms", "insert_alarm", "resolve_alarm", "insert_messages", "existing_ids",
]

MESSAGE = "tidemq_message"
ARCHIVE_BATCH = "tidemq_archive_batch"
STATS = "tidemq_topic_stats"
ALARM = "tidemq_alarm"
TOPIC = "tidemq_topic"
DEFAULT_RETENTION_DAYS = 7  # a topic without a row in tidemq_topic (TopicSettings' default)
_SAFE = re.compile(r"^[A-Za-z0-9._:-]+$")


def _literal(value: str) -> str:
    """A SQL string literal; topic names are validated on produce, but the pipeline still quotes."""
    if _SAFE.match(value):
        return f"'{value}'"
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


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
        """The broker's retention job deletes this topic's SUCCESS rows itself (it leaves topics
        marked ``archive`` or kept forever with ``retention_days`` 0 to the archive)."""
        return not self.archive and self.retention_days > 0


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
            return (now - timedelta(days=max(days, 0), seconds=min_age)).replace(microsecond=now.microsecond // 1000 * 1000)

        settings = list(settings)
        return cls(cut(DEFAULT_RETENTION_DAYS), {row.name: cut(row.retention_days) for row in settings},
                   tuple(sorted(row.name for row in settings if row.broker_deletes_success)))

    def to_json(self) -> str:
        return json.dumps({"default": self.default.isoformat(), "topics": {k: v.isoformat() for k, v in self.topics.items()},
                           "success_by_broker": list(self.success_by_broker)})

    @classmethod
    def from_json(cls, text: str) -> "Cutoffs":
        raw = json.loads(text)
        return cls(datetime.fromisoformat(raw["default"]), {k: datetime.fromisoformat(v) for k, v in raw["topics"].items()},
                   tuple(raw.get("success_by_broker", ())))

    def predicate(self) -> str:
        """The SQL condition selecting archivable rows."""
        fmt = "%Y-%m-%d %H:%M:%S.%f"
        cases = " ".join(f"WHEN {_literal(t)} THEN '{c.strftime(fmt)}'" for t, c in sorted(self.topics.items()))
        cutoff = f"CASE topic {cases} ELSE '{self.default.strftime(fmt)}' END" if cases else f"'{self.default.strftime(fmt)}'"
        statuses = "status IN ('SUCCESS', 'FAIL')"
        if self.success_by_broker:
            kept = ", ".join(_literal(t) for t in self.success_by_broker)
            statuses = f"(status = 'FAIL' OR (status = 'SUCCESS' AND topic NOT IN ({kept})))"
        return f"{statuses} AND finish_time IS NOT NULL AND finish_time < {cutoff}"


@dataclass(frozen=True)
class BatchRow:
    """One archive batch: the ids [id_from, id_to) that match its cutoffs."""

    id: int
    id_from: int
    id_to: int
    cutoffs: Cutoffs
    state: str
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


def topics(conn) -> list[TopicRow]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT name, retention_days, alarm_backlog, alarm_failure_rate, alarm_due_age, archive FROM {TOPIC}")
        return [TopicRow(*row) for row in cur.fetchall()]


def eligible_bounds(conn, cutoffs: Cutoffs) -> tuple[Optional[int], Optional[int], int]:
    """(smallest id, largest id, count) of the archivable rows."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN(id), MAX(id), COUNT(*) FROM {MESSAGE} WHERE {cutoffs.predicate()}")
        low, high, count = cur.fetchone()
        return low, high, int(count)


def partition_counts(conn, id_from: int, id_to: int, cutoffs: Cutoffs) -> dict[tuple[str, date], int]:
    """Archivable rows in [id_from, id_to) per (topic, day of finish_time)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT topic, DATE(finish_time), COUNT(*) FROM {MESSAGE} WHERE id >= %s AND id < %s AND "
                    f"{cutoffs.predicate()} GROUP BY topic, DATE(finish_time)", (id_from, id_to))
        return {(topic, day): int(n) for topic, day, n in cur.fetchall()}


def open_batches(conn) -> list[BatchRow]:
    """Batches a previous run started and did not finish, oldest first."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, id_from, id_to, cutoffs, state, expected_rows FROM {ARCHIVE_BATCH} "
                    "WHERE state <> 'DONE' ORDER BY id")
        return [BatchRow(i, lo, hi, Cutoffs.from_json(c), s, int(e)) for i, lo, hi, c, s, e in cur.fetchall()]


def start_batch(conn, id_from: int, id_to: int, cutoffs: Cutoffs, expected: int, path: str, now: datetime) -> BatchRow:
    with conn.cursor() as cur:
        cur.execute(
            f"INSERT INTO {ARCHIVE_BATCH} (id_from, id_to, cutoffs, path, state, expected_rows, started_at) "
            "VALUES (%s, %s, %s, %s, 'PENDING', %s, %s)",
            (id_from, id_to, cutoffs.to_json(), path, expected, now))
        return BatchRow(cur.lastrowid, id_from, id_to, cutoffs, "PENDING", expected)


def set_batch_state(conn, batch_id: int, state: str, now: datetime, written: Optional[int] = None,
                    deleted: Optional[int] = None, expected: Optional[int] = None) -> None:
    """Move a batch to WRITTEN (Parquet verified) or DONE (rows deleted from MySQL)."""
    with conn.cursor() as cur:
        cur.execute(
            f"UPDATE {ARCHIVE_BATCH} SET state = %s, written_rows = COALESCE(%s, written_rows), "
            "deleted_rows = COALESCE(%s, deleted_rows), expected_rows = COALESCE(%s, expected_rows), "
            "finished_at = IF(%s = 'DONE', %s, finished_at) WHERE id = %s",
            (state, written, deleted, expected, state, now, batch_id))


def delete_range(conn, id_from: int, id_to: int, cutoffs: Cutoffs) -> int:
    """Delete the archivable rows in [id_from, id_to) in one transaction; return how many."""
    with conn.cursor() as cur:
        cur.execute(f"DELETE FROM {MESSAGE} WHERE id >= %s AND id < %s AND {cutoffs.predicate()}", (id_from, id_to))
        return cur.rowcount


_STAT_COLUMNS = ("topic", "hour", "produced", "succeeded", "failed", "retried", "lease_expired", "backlog",
                 "lateness_p50_ms", "lateness_p95_ms", "lateness_p99_ms",
                 "duration_p50_ms", "duration_p95_ms", "duration_p99_ms", "computed_at")


def upsert_stats(conn, rows: Sequence[dict[str, Any]], chunk: int = 1000) -> int:
    """Write one row per (topic, hour), replacing what an earlier run computed."""
    names = ", ".join(_STAT_COLUMNS)
    marks = ", ".join(["%s"] * len(_STAT_COLUMNS))
    updates = ", ".join(f"{c} = VALUES({c})" for c in _STAT_COLUMNS[2:])
    sql = f"INSERT INTO {STATS} ({names}) VALUES ({marks}) ON DUPLICATE KEY UPDATE {updates}"
    with conn.cursor() as cur:
        for start in range(0, len(rows), chunk):
            cur.executemany(sql, [tuple(row[c] for c in _STAT_COLUMNS) for row in rows[start:start + chunk]])
    return len(rows)


def open_alarms(conn) -> dict[tuple[str, str], int]:
    """(topic, kind) -> id of each alarm raised and not yet resolved."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT topic, kind, MAX(id) FROM {ALARM} WHERE resolved_at IS NULL GROUP BY topic, kind")
        return {(topic, kind): alarm_id for topic, kind, alarm_id in cur.fetchall()}


def insert_alarm(conn, topic: str, kind: str, value: float, threshold: float, message: str, now: datetime) -> int:
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {ALARM} (topic, kind, value, threshold, message, raised_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s)", (topic, kind, value, threshold, message[:1000], now))
        return cur.lastrowid


def resolve_alarm(conn, alarm_id: int, now: datetime) -> None:
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {ALARM} SET resolved_at = %s WHERE id = %s AND resolved_at IS NULL", (now, alarm_id))


_MESSAGE_COLUMNS = ("id", "topic", "data", "status", "effect_time", "order_time", "retry_remaining", "retry_schedule",
                    "attempt", "ttr", "lease_token", "lease_expire", "consumer", "unique_key", "version", "trace",
                    "add_time", "update_time", "start_time", "finish_time")


def existing_ids(conn, ids: Sequence[int]) -> set[int]:
    """Which of ``ids`` are in the message table."""
    if not ids:
        return set()
    with conn.cursor() as cur:
        cur.execute(f"SELECT id FROM {MESSAGE} WHERE id IN ({', '.join(['%s'] * len(ids))})", list(ids))
        return {row[0] for row in cur.fetchall()}


def insert_messages(conn, rows: Sequence[dict[str, Any]]) -> int:
    """Insert whole message rows (ids kept) in one transaction; rows whose id or (topic,
    unique_key) is taken are skipped, so restoring twice is harmless. Returns rows inserted."""
    if not rows:
        return 0
    names = ", ".join(_MESSAGE_COLUMNS)
    marks = ", ".join(["%s"] * len(_MESSAGE_COLUMNS))
    with conn.cursor() as cur:
        inserted = cur.executemany(f"INSERT IGNORE INTO {MESSAGE} ({names}) VALUES ({marks})",
                                   [tuple(row[c] for c in _MESSAGE_COLUMNS) for row in rows])
    conn.commit()
    return int(inserted or 0)
