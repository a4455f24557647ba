"""Schedules in memory: declared, listed, paused and ticked, as the SQL storage keeps them."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Optional

from ...records import Schedule
from .state import MemoryState

__all__ = ["MemorySchedules"]


class MemorySchedules:
    """The storage operations on schedules."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def put_schedule(self, schedule: Schedule, now: datetime) -> bool:
        with self._state.lock:
            stored = self._state.schedules.get(schedule.name)
            fields = {"topic": schedule.topic, "cron": schedule.cron, "timezone": schedule.timezone,
                      "data": schedule.data, "retry": schedule.retry, "missed": schedule.missed, "update_time": now}
            if stored is None:
                self._state.schedules[schedule.name] = dataclasses.replace(
                    schedule, ticks_from=now, last_tick=None, add_time=now, **fields)
                return True
            if (stored.cron, stored.timezone) != (schedule.cron, schedule.timezone):
                # The old expression's ticks are not the new one's: start from now.
                fields.update(ticks_from=now, last_tick=None)
            self._state.schedules[schedule.name] = dataclasses.replace(stored, **fields)
            return False

    def list_schedules(self) -> list[Schedule]:
        with self._state.lock:
            return [dataclasses.replace(s) for _, s in sorted(self._state.schedules.items())]

    def get_schedule(self, name: str) -> Optional[Schedule]:
        with self._state.lock:
            stored = self._state.schedules.get(name)
            return dataclasses.replace(stored) if stored is not None else None

    def delete_schedule(self, name: str) -> bool:
        with self._state.lock:
            return self._state.schedules.pop(name, None) is not None

    def pause_schedule(self, name: str, paused: bool, now: datetime) -> bool:
        with self._state.lock:
            stored = self._state.schedules.get(name)
            if stored is None:
                return False
            # A resumed schedule does not catch up what fell due during the pause.
            self._state.schedules[name] = dataclasses.replace(
                stored, paused=paused, update_time=now, ticks_from=stored.ticks_from if paused else now)
            return True

    def advance_schedule(self, name: str, tick: datetime) -> bool:
        with self._state.lock:
            stored = self._state.schedules.get(name)
            # Never back: a leader that lost leadership mid-round cannot undo a later round.
            if stored is None or (stored.last_tick is not None and stored.last_tick >= tick):
                return False
            self._state.schedules[name] = dataclasses.replace(stored, last_tick=tick)
            return True
