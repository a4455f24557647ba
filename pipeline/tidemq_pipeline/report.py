"""The report job: hourly per-topic statistics over the live table and the archive, written to
tidemq_topic_stats (the console charts it), and the window's workflow figures (``workflows.py``):
workflows started, ended by state and running, in the summary line the job prints."""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from tidemq.tables import TOPIC_STATS

from . import stats, store, workflows
from .database import Database
from .progress import JobSummary
from .sources import all_messages

__all__ = ["run_report"]


def run_report(spark, db: Database, archive_path: Optional[str] = None, since: Optional[datetime] = None,
               summary: Optional[JobSummary] = None) -> JobSummary:
    """Compute every topic's hourly statistics and upsert the hours from ``since`` on (all when
    None) into tidemq_topic_stats. Backlog is cumulative, so it is always computed from the start.
    The workflow figures of the same window go to ``summary.extra`` (``workflows_started``, ...)."""
    summary = summary or JobSummary("report")
    messages = all_messages(spark, db, archive_path).cache()
    try:
        summary.read = messages.count()
        summary.progress(f"{summary.read} messages read (live table{' + archive' if archive_path else ''})")
        hourly = stats.hourly_stats(messages)
        if since is not None:
            hourly = hourly.where(hourly[TOPIC_STATS.hour] >= since.replace(minute=0, second=0, microsecond=0))
        rows = [row.asDict() for row in hourly.collect()]
        figures = workflows.window_figures(workflows.workflow_outcomes(messages), since)
    finally:
        messages.unpersist()
    conn = db.connect()
    try:
        now = store.db_now(conn)
        for row in rows:
            row[TOPIC_STATS.computed_at] = now
        summary.written = store.upsert_stats(conn, rows)
    finally:
        conn.close()
    summary.extra["topics"] = len({row[TOPIC_STATS.topic] for row in rows})
    summary.extra.update((f"workflows_{name}", n) for name, n in figures.items())
    summary.progress(f"{summary.written} topic-hours written to {TOPIC_STATS.name}")
    return summary
