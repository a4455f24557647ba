"""Topic settings of the SQL storage: the topic table, created with defaults on first use."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import Connection, insert, select, update

from ..records import FlowLimits, TopicSettings
from ..schema import topic as t
from .database import SqlDatabase

__all__ = ["Topics", "topic_values", "setting_columns"]


def setting_columns() -> list[Any]:
    """The topic row's columns that are settings (TopicSettings' fields): not its times, nor the
    rate's token bucket, which is the lock's state."""
    return [c for c in t.c if c.name not in ("add_time", "update_time", "rate_tokens", "rate_at")]


class Topics:
    """Topic settings: created with defaults, listed, saved, and their flow limits set."""

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

    def list_topics(self) -> list[TopicSettings]:
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


def topic_values(s: TopicSettings, now: datetime) -> dict[str, Any]:
    """The topic row of ``s``, created ``now``."""
    values = dict(vars(s))
    values.update(add_time=now, update_time=now)
    return values
