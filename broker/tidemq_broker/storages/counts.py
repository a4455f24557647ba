"""Counts of messages per topic in the SQL storage: the leader's backlog gauges and counts, and
the stored count the console reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from sqlalchemy import Connection, case, delete, func, insert, select

from tidemq.lifecycle import MessageStatus

from ..records import Backlog
from ..schema import message as m
from ..schema import topic_count as tc
from .database import SqlDatabase
from .reads import topics_present

__all__ = ["StatusCounts"]


class StatusCounts:
    """Messages per topic and status: the backlog, a count, the leader's stored count."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def backlog(self, now: datetime) -> list[Backlog]:
        new, running = MessageStatus.NEW.value, MessageStatus.RUNNING.value

        def work(conn: Connection) -> list[Any]:
            # Topic by topic along (topic, status, effect_time): the NEW and RUNNING ranges only,
            # never the finished rows, read from the index alone.
            topics = topics_present(conn)
            if not topics:
                return []
            due = m.c.effect_time <= now
            return conn.execute(
                select(m.c.topic, m.c.status, func.count(), func.sum(case((due, 1), else_=0)),
                       func.min(case((due, m.c.effect_time), else_=None)))
                .where(m.c.topic.in_(topics), m.c.status.in_([new, running]))
                .group_by(m.c.topic, m.c.status)).all()

        found: dict[str, dict[str, Any]] = {}
        for topic, status, count, due_count, oldest in self._db.tx(work):
            entry = found.setdefault(topic, {"due": 0, "scheduled": 0, "running": 0, "oldest_due": None})
            if status == running:
                entry["running"] = int(count)
            else:
                entry.update(due=int(due_count or 0), scheduled=int(count) - int(due_count or 0), oldest_due=oldest)
        return [Backlog(topic, **values) for topic, values in sorted(found.items())]

    def save_topic_counts(self, counts: dict[str, dict[str, int]], now: datetime) -> None:
        rows = [{"topic": topic, "status": status, "messages": n, "counted_at": now}
                for topic, by_status in counts.items() for status, n in by_status.items()]

        def work(conn: Connection) -> None:
            conn.execute(delete(tc))  # a small table: the whole count is replaced at once
            if rows:
                conn.execute(insert(tc), rows)

        self._db.tx(work)

    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        stmt = select(m.c.topic, m.c.status, func.count()).group_by(m.c.topic, m.c.status)
        if topic:
            stmt = stmt.where(m.c.topic == topic)
        counts: dict[str, dict[str, int]] = {}
        for name, status, n in self._db.tx(lambda conn: conn.execute(stmt).all()):
            counts.setdefault(name, {})[status] = n
        return counts
