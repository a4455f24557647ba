"""Topic settings and message reads of the SQL storage (lookups, counts, the topics present)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Optional, Sequence

from sqlalchemy import Connection, case, delete, func, insert, select, update

from tidemq.lifecycle import MessageStatus

from ..schema import message as m
from ..schema import topic as t
from ..schema import topic_count as tc
from ..storage import Backlog, FlowLimits, StoredMessage, TopicSettings
from .database import SqlDatabase

__all__ = ["Reads", "to_message", "topics_present", "topic_values", "setting_columns"]


def setting_columns() -> list[Any]:
    """The topic row's columns that are settings (TopicSettings' fields): not its times, nor the
    rate's token bucket, which is the lock's state."""
    return [c for c in t.c if c.name not in ("add_time", "update_time", "rate_tokens", "rate_at")]


def to_message(row: Any) -> StoredMessage:
    """Map a full message row to a StoredMessage."""
    values = dict(row._mapping)
    schedule = values.get("retry_schedule")
    values["retry_schedule"] = json.loads(schedule) if schedule else None
    return StoredMessage(**values)


def topics_present(conn: Connection) -> list[str]:
    """Every topic that has messages, from the message table itself (a topic row may be missing,
    and nothing stored may be left out): MySQL answers it by jumping from topic to topic along an
    index that starts with topic."""
    return list(conn.execute(select(m.c.topic).distinct()).scalars())


class Reads:
    """Topic settings and message lookups."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        def work(conn: Connection) -> None:
            known = set(conn.execute(select(t.c.name).where(t.c.name.in_(list(names)))).scalars())
            missing = sorted(set(names) - known)
            if missing:
                self._db.dialect.insert_topics_ignoring_duplicates(
                    conn, [topic_values(TopicSettings(n), now) for n in missing])

        self._db.tx(work)

    def topics(self) -> list[TopicSettings]:
        cols = setting_columns()
        rows = self._db.tx(lambda conn: conn.execute(select(*cols).order_by(t.c.name)).all())
        return [TopicSettings(**dict(r._mapping)) for r in rows]

    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        def work(conn: Connection) -> None:
            values = topic_values(settings, now)
            if conn.execute(select(t.c.name).where(t.c.name == settings.name)).first() is None:
                conn.execute(insert(t).values(values))
            else:
                values.pop("add_time")
                conn.execute(update(t).where(t.c.name == settings.name).values(values))

        self._db.tx(work)

    def set_topic_limits(self, name: str, limits: FlowLimits, now: datetime) -> None:
        self.ensure_topics([name], now)
        # A new rate starts with a full bucket (NULL tokens) rather than the old rate's leftovers.
        self._db.tx(lambda conn: conn.execute(update(t).where(t.c.name == name).values(
            max_running=limits.max_running, rate_per_second=limits.rate_per_second,
            max_running_per_key=limits.max_running_per_key, rate_tokens=None, rate_at=None, update_time=now)))

    def get_message(self, id: int) -> Optional[StoredMessage]:
        row = self._db.tx(lambda conn: conn.execute(select(m).where(m.c.id == id)).first())
        return to_message(row) if row is not None else None

    def message_topics(self, ids: Sequence[int]) -> set[str]:
        wanted = sorted(set(ids))
        if not wanted:
            return set()
        return set(self._db.tx(lambda conn: conn.execute(
            select(m.c.topic).where(m.c.id.in_(wanted)).distinct()).scalars()))

    def lease_topics(self, lease_token: str) -> set[str]:
        def work(conn: Connection) -> set[str]:
            # As in Leases.release: no index leads with lease_token, the RUNNING rows of each
            # topic are one range of (topic, status, lease_expire).
            topics = topics_present(conn)
            if not topics:
                return set()
            return set(conn.execute(select(m.c.topic).where(
                m.c.topic.in_(topics), m.c.status == MessageStatus.RUNNING.value, m.c.lease_token == lease_token).distinct()).scalars())

        return self._db.tx(work)

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


def topic_values(s: TopicSettings, now: datetime) -> dict[str, Any]:
    """The topic row of ``s``, created ``now``."""
    values = dict(vars(s))
    values.update(add_time=now, update_time=now)
    return values
