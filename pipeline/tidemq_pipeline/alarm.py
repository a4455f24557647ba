"""The alarm job: topics pushed over their thresholds become rows of tidemq_alarm (shown in the
console) and are sent to the notifiers. An alarm stays open while its condition holds (no repeat
notifications) and is resolved by the first run that finds the condition gone."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Optional, Sequence

from tidemq.tables import MESSAGE as M
from tidemq.tables import TOPIC

from . import rules, store
from .database import Database
from .notifiers import Alarm, LogNotifier, Notifier
from .progress import JobSummary
from .sources import live_messages

__all__ = ["run_alarm"]

log = logging.getLogger("tidemq.pipeline.alarm")

_UNITS = {"backlog": "messages", "due_age": "s"}


def _describe(topic: str, kind: str, value: float, threshold: float) -> str:
    if kind == "failure_rate":
        return f"failure rate of {topic} is {value:.1%}, above the threshold {threshold:.1%}"
    if kind == "lease_overrun":
        return (f"{int(value)} message(s) of {topic} are RUNNING past their lease "
                "(is a broker leader running lease expiry?)")
    shown = f"{value:.0f}"
    return f"{kind.replace('_', ' ')} of {topic} is {shown} {_UNITS[kind]}, above the threshold {threshold:.0f}"


def run_alarm(spark, db: Database, notifiers: Optional[Sequence[Notifier]] = None, window: float = 3600.0,
              lease_grace: float = 60.0, summary: Optional[JobSummary] = None) -> JobSummary:
    """Check every topic; raise new alarms, resolve cleared ones; return the counters."""
    summary = summary or JobSummary("alarm")
    notifiers = list(notifiers) if notifiers is not None else [LogNotifier()]
    conn = db.connect()
    try:
        now = store.db_now(conn)
        since = (now.replace(microsecond=0) - timedelta(seconds=window)).isoformat(" ")
        # Only what the rules look at: unfinished messages and those finished within the window.
        where = f"{store.status_in(rules.PENDING_STATUSES)} OR {M.finish_time} >= '{since}'"
        messages = live_messages(spark, db, where=where)
        topics = spark.createDataFrame(
            [(t.name, t.alarm_backlog, t.alarm_failure_rate, t.alarm_due_age) for t in store.topics(conn)],
            f"{TOPIC.topic_name} string, {TOPIC.alarm_backlog} long, {TOPIC.alarm_failure_rate} double, "
            f"{TOPIC.alarm_due_age} long")
        figures = rules.health(messages, now, window, lease_grace).cache()
        summary.read = int(figures.groupBy().sum("rows").collect()[0][0] or 0)
        found = {(r[M.topic], r["kind"]): (r["value"], r["threshold"]) for r in rules.raised(figures, topics).collect()}
        figures.unpersist()
        opened = store.open_alarms(conn)
        fresh = []
        for (topic, kind), (value, threshold) in sorted(found.items()):
            if (topic, kind) in opened:
                continue
            text = _describe(topic, kind, value, threshold)
            alarm_id = store.insert_alarm(conn, topic, kind, value, threshold, text, now)
            fresh.append(Alarm(alarm_id, topic, kind, value, threshold, text, now))
        resolved = [key for key in opened if key not in found]
        for key in resolved:
            store.resolve_alarm(conn, opened[key], now)
            log.info("alarm resolved: %s %s", *key)
    finally:
        conn.close()
    for notifier in notifiers if fresh else []:
        try:
            notifier.send(fresh)
        except Exception as exc:  # one broken channel must not hide the alarm from the others
            log.error("notifier %s failed: %s", notifier.name, exc)
            summary.extra[f"{notifier.name}_failed"] = 1
    summary.written = len(fresh)
    summary.extra.update(raised=len(fresh), open=len(found), resolved=len(resolved))
    summary.progress(f"{len(fresh)} alarm(s) raised, {len(found)} open, {len(resolved)} resolved")
    return summary
