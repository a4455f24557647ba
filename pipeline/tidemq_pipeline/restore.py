"""Requeue from the archive: archived dead letters (or successes) go back to MySQL as NEW.

Each message keeps its id (ids are never reused, so the id is free again) and its trace, with a
RESTORED line appended. Inserting an id that is already live is skipped, so restoring the same
range twice puts each message back once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from pyspark.sql import functions as F

from tidemq import lifecycle
from tidemq.errors import TidemqError, ValidationError
from tidemq.lifecycle import ARCHIVABLE_STATUSES, Change, MessageStatus
from tidemq.tables import MESSAGE as M

from . import frames, store
from .database import Database
from .progress import JobSummary
from .sources import archived_messages

__all__ = ["run_restore", "parse_time", "RESTORABLE", "restored"]

#: What a restore may put back: finished messages, the archive's content.
RESTORABLE: tuple[MessageStatus, ...] = ARCHIVABLE_STATUSES
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


def _status(status: str) -> MessageStatus:
    if status not in {s.value for s in RESTORABLE}:
        raise ValidationError(f"--status must be one of {', '.join(s.value for s in RESTORABLE)}, got {status!r}")
    return MessageStatus(status)


def restored(message: dict[str, Any], change: Change) -> dict[str, Any]:
    """An archived message row as the lifecycle's ``restore`` puts it back: its columns set,
    its trace line appended, its version moved on."""
    row = {**message, **change.values}
    for name in frames.ARCHIVE_OMITS:  # read as NULL from the files that lack it: the default fills it
        row.pop(name, None)
    row[M.trace] = (message.get(M.trace) or "") + change.trace
    if change.bump_version and message.get(M.version) is not None:
        row[M.version] = message[M.version] + 1
    if change.attempt_delta and message.get(M.attempt) is not None:
        row[M.attempt] = message[M.attempt] + change.attempt_delta
    return row


def run_restore(spark, db: Database, archive_path: str, topic: str, status: str = MessageStatus.FAIL.value,
                since: Optional[datetime] = None, until: Optional[datetime] = None, retry: int = 0,
                summary: Optional[JobSummary] = None) -> JobSummary:
    """Put archived ``status`` messages of ``topic`` finished in [since, until) back as NEW."""
    wanted_status = _status(status)
    if retry < 0:
        raise ValidationError(f"--retry must be 0 or more, got {retry}")
    summary = summary or JobSummary("restore")
    archived = archived_messages(spark, archive_path)
    if archived is None:
        raise TidemqError(f"no archive at {archive_path}: run `tidemq pipeline archive --archive {archive_path}` first")
    wanted = archived.where((F.col(M.topic) == topic) & frames.has_status([wanted_status]))
    if since is not None:
        wanted = wanted.where(F.col(M.finish_time) >= F.lit(since))
    if until is not None:
        wanted = wanted.where(F.col(M.finish_time) < F.lit(until))
    wanted = frames.newest_copy(wanted.withColumn("_source", F.lit(1))).orderBy(M.id)
    conn = db.connect(autocommit=False)
    try:
        change = lifecycle.restore(store.db_now(conn), retry, source="archive", retries=retry)
        chunk: list[dict] = []
        for row in wanted.select(*archived.columns).toLocalIterator():
            chunk.append(restored(row.asDict(), change))
            if len(chunk) >= CHUNK:
                summary.written += store.insert_messages(conn, chunk)
                summary.read += len(chunk)
                chunk = []
        summary.written += store.insert_messages(conn, chunk)
        summary.read += len(chunk)
    finally:
        conn.close()
    summary.extra["skipped"] = summary.read - summary.written
    summary.progress(f"{summary.written} {wanted_status.value} message(s) of {topic} restored as "
                     f"{MessageStatus.NEW.value}, {summary.read - summary.written} already live")
    return summary
