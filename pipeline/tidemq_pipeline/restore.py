"""Requeue from the archive: archived dead letters (or successes) go back to MySQL as NEW.

Each message keeps its id (ids are never reused, so the id is free again) and its trace, with a
RESTORED line appended. Inserting an id that is already live is skipped, so restoring the same
range twice puts each message back once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from pyspark.sql import functions as F

from tidemq.errors import TidemqError, ValidationError

from . import frames, store
from .database import Database
from .progress import JobSummary
from .sources import MESSAGE_COLUMNS, archived_messages

__all__ = ["run_restore", "parse_time", "RESTORABLE"]

RESTORABLE = ("FAIL", "SUCCESS")
CHUNK = 1000


def parse_time(text: Optional[str], flag: str) -> Optional[datetime]:
    """An ISO date or date-time in UTC (``2024-03-01``, ``2024-03-01T12:00:00``), or None."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().rstrip("Z"))
    except ValueError:
        raise ValidationError(f"{flag} must be an ISO date or date-time in UTC such as 2024-03-01 or "
                              f"2024-03-01T12:00:00, got {text!r}") from None
    if moment.tzinfo is not None:
        raise ValidationError(f"{flag} is read as UTC: leave the offset out, got {text!r}")
    return moment


def _trace_line(at: datetime, event: str, **fields: object) -> str:
    # The broker's trace format (tidemq_broker.trace), which the pipeline may not import.
    head = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z {event}"
    return head + "".join(f" {key}={value}" for key, value in fields.items()) + "\n"


def run_restore(spark, db: Database, archive_path: str, topic: str, status: str = "FAIL",
                since: Optional[datetime] = None, until: Optional[datetime] = None, retry: int = 0,
                summary: Optional[JobSummary] = None) -> JobSummary:
    """Put archived ``status`` messages of ``topic`` finished in [since, until) back as NEW."""
    if status not in RESTORABLE:
        raise ValidationError(f"--status must be one of {', '.join(RESTORABLE)}, got {status!r}")
    if retry < 0:
        raise ValidationError(f"--retry must be 0 or more, got {retry}")
    summary = summary or JobSummary("restore")
    archived = archived_messages(spark, archive_path)
    if archived is None:
        raise TidemqError(f"no archive at {archive_path}: run `tidemq pipeline archive --archive {archive_path}` first")
    wanted = archived.where((F.col("topic") == topic) & (F.col("status") == status))
    if since is not None:
        wanted = wanted.where(F.col("finish_time") >= F.lit(since))
    if until is not None:
        wanted = wanted.where(F.col("finish_time") < F.lit(until))
    wanted = frames.newest_copy(wanted.withColumn("_source", F.lit(1))).orderBy("id")
    conn = db.connect(autocommit=False)
    try:
        now = store.db_now(conn)
        note = _trace_line(now, "RESTORED", source="archive", retry=retry)
        chunk: list[dict] = []
        for row in wanted.select(*MESSAGE_COLUMNS).toLocalIterator():
            message = row.asDict()
            message.update(status="NEW", effect_time=now, retry_remaining=retry, lease_token=None, lease_expire=None,
                           consumer=None, finish_time=None, update_time=now, version=message["version"] + 1,
                           trace=message["trace"] + note)
            chunk.append(message)
            if len(chunk) >= CHUNK:
                summary.written += store.insert_messages(conn, chunk)
                summary.read += len(chunk)
                chunk = []
        summary.written += store.insert_messages(conn, chunk)
        summary.read += len(chunk)
    finally:
        conn.close()
    summary.extra["skipped"] = summary.read - summary.written
    summary.progress(f"{summary.written} {status} message(s) of {topic} restored as NEW, "
                     f"{summary.read - summary.written} already live")
    return summary
