"""Schedules: the stored periodic messages, declared, listed, paused and ticked."""

from __future__ import annotations

from datetime import datetime
from typing import Optional

from sqlalchemy import Connection, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from ..schema import schedule as s
from ..records import Schedule
from .database import SqlDatabase

__all__ = ["Schedules"]


def _schedule(row) -> Schedule:
    return Schedule(name=row.name, topic=row.topic, cron=row.cron, timezone=row.timezone, data=row.data,
                    retry=row.retry, missed=row.missed, paused=bool(row.paused), ticks_from=row.ticks_from,
                    last_tick=row.last_tick, add_time=row.add_time, update_time=row.update_time)


class Schedules:
    """The storage operations on ``tidemq_schedule``."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    def put_schedule(self, schedule: Schedule, now: datetime) -> bool:
        def work(conn: Connection) -> bool:
            row = conn.execute(select(s.c.cron, s.c.timezone).where(s.c.name == schedule.name)
                               .with_for_update()).first()
            values = {"topic": schedule.topic, "cron": schedule.cron, "timezone": schedule.timezone,
                      "data": schedule.data, "retry": schedule.retry, "missed": schedule.missed, "update_time": now}
            if row is None:
                conn.execute(insert(s).values(name=schedule.name, paused=schedule.paused, ticks_from=now,
                                              last_tick=None, add_time=now, **values))
                return True
            if (row.cron, row.timezone) != (schedule.cron, schedule.timezone):
                # The old expression's ticks are not the new one's: start the new ones from now
                # rather than catch up ticks it never had.
                values.update(ticks_from=now, last_tick=None)
            conn.execute(update(s).where(s.c.name == schedule.name).values(**values))
            return False

        try:
            return self._db.tx(work)
        except IntegrityError:
            # Declared by two workers at once: the other one inserted it; this one updates it.
            return self._db.tx(work)

    def list_schedules(self) -> list[Schedule]:
        rows = self._db.tx(lambda conn: conn.execute(select(s).order_by(s.c.name)).all())
        return [_schedule(row) for row in rows]

    def get_schedule(self, name: str) -> Optional[Schedule]:
        row = self._db.tx(lambda conn: conn.execute(select(s).where(s.c.name == name)).first())
        return None if row is None else _schedule(row)

    def delete_schedule(self, name: str) -> bool:
        return self._db.tx(lambda conn: conn.execute(delete(s).where(s.c.name == name)).rowcount) == 1

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> bool:
        values: dict[str, object] = {"paused": paused, "update_time": now}
        if not paused:
            values["ticks_from"] = now  # what fell due during the pause is not caught up
        return self._db.tx(lambda conn: conn.execute(
            update(s).where(s.c.name == name).values(**values)).rowcount) == 1

    def advance_schedule(self, name: str, tick: datetime) -> bool:
        # Guarded so that a leader that lost leadership mid-round cannot move a schedule back.
        return self._db.tx(lambda conn: conn.execute(
            update(s).where(s.c.name == name, or_(s.c.last_tick.is_(None), s.c.last_tick < tick))
            .values(last_tick=tick)).rowcount) == 1
