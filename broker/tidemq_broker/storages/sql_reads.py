"""Topic settings and the read side of the SQL storage (console lists, counts, lookups).

A mixin of :class:`tidemq_broker.storages.sql.SqlStorage`: it uses the storage's ``_tx`` and its
dialect hook ``_insert_topics_ignoring_duplicates``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Optional, Sequence, TypeVar

from sqlalchemy import Connection, func, insert, select, update

from ..schema import message as m
from ..schema import topic as t
from ..storage import MessageFilter, StoredMessage, TopicSettings

__all__ = ["SqlReads", "to_message"]

T = TypeVar("T")


def to_message(row: Any) -> StoredMessage:
    """Map a full message row to a StoredMessage."""
    values = dict(row._mapping)
    schedule = values.get("retry_schedule")
    values["retry_schedule"] = json.loads(schedule) if schedule else None
    return StoredMessage(**values)


class SqlReads:
    """Topic settings and message reads, shared by every SQL dialect."""

    _tx: Callable[..., Any]

    def _insert_topics_ignoring_duplicates(self, conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert topic rows, skipping names already present (dialect hook)."""
        raise NotImplementedError

    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        def work(conn: Connection) -> None:
            known = set(conn.execute(select(t.c.name).where(t.c.name.in_(list(names)))).scalars())
            missing = sorted(set(names) - known)
            if missing:
                self._insert_topics_ignoring_duplicates(conn, [self._topic_values(TopicSettings(n), now) for n in missing])

        self._tx(work)

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
