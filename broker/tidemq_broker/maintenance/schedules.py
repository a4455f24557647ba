"""Periodic messages: the leader produces each schedule's due ticks, one message per tick.

Each tick is produced with the unique key ``schedule:<name>:<tick>`` through the broker's group
commit, and only then recorded as the schedule's ``last_tick``. A leader killed between the two
leaves the tick unrecorded; the next leader produces it again, and the unique key makes that
second produce return the first message instead of storing another. So a failover can delay a
tick, never double it.

The job reads the schedule table every ``reload`` seconds, not every round, so an idle leader
costs the database next to nothing; between reads it ticks from its own copy. A schedule added,
changed, paused or deleted elsewhere is therefore seen within ``reload`` seconds (kept below
``MISSED_AFTER``, so a new schedule's first ticks are still produced, late, rather than missed).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime
from typing import Callable, Optional, Sequence

from tidemq import clock

from ..errors import RetriableError
from ..schedules import MISSED_AFTER, due_ticks, next_tick, unique_key
from ..storage import NewRow, Schedule, ScheduleStore

__all__ = ["ScheduleTicks"]

log = logging.getLogger(__name__)

Produce = Callable[[Sequence[NewRow]], list[int]]


class ScheduleTicks:
    """Produces the due ticks of every schedule not paused, each round."""

    name = "schedules"

    def __init__(self, schedules: ScheduleStore, produce: Produce, default_retry: Callable[[str], int],
                 interval: float = 0.25, missed_after: float = MISSED_AFTER, reload: float = 5.0) -> None:
        self._store = schedules
        self._reload = reload
        self._loaded_at = float("-inf")
        self._schedules: list[Schedule] = []
        self._produce = produce
        self._default_retry = default_retry
        self.interval = interval
        self._missed_after = missed_after
        # name -> (the stored state it was computed from, its next tick): a round asks croniter
        # only about schedules whose next tick has come or whose row changed.
        self._next: dict[str, tuple[tuple, Optional[datetime]]] = {}

    def run(self) -> int:
        produced = 0
        if time.monotonic() - self._loaded_at >= self._reload:
            self._schedules = self._store.list_schedules()
            self._loaded_at = time.monotonic()
            names = {schedule.name for schedule in self._schedules}
            for gone in [name for name in self._next if name not in names]:
                del self._next[gone]
        for index, schedule in enumerate(self._schedules):
            if schedule.paused:
                continue
            try:
                produced += self._tick(index, schedule)
            except RetriableError:
                raise  # the database or the writer is away: every schedule would fail alike, said once
            except Exception:  # one bad schedule (an unknown zone on this host) must not stop the others
                log.warning("schedule %s could not tick", schedule.name, exc_info=True)
        return produced

    def stop_leading(self) -> None:
        """Leadership ended: the next term starts from the table, not from this copy."""
        self._next.clear()
        self._schedules, self._loaded_at = [], float("-inf")

    def _tick(self, index: int, schedule: Schedule) -> int:
        now = clock.now()
        state = (schedule.cron, schedule.timezone, schedule.ticks_from, schedule.last_tick)
        cached = self._next.get(schedule.name)
        if cached is not None and cached[0] == state and (cached[1] is None or now < cached[1]):
            return 0
        due = due_ticks(schedule, now, self._missed_after)
        if due.last is None:
            self._next[schedule.name] = (state, next_tick(schedule, now))
            return 0
        if due.produce:
            retry = schedule.retry if schedule.retry is not None else self._default_retry(schedule.topic)
            self._produce([NewRow(topic=schedule.topic, data=schedule.data, effect_time=tick, retry_remaining=retry,
                                  unique_key=unique_key(schedule.name, tick)) for tick in due.produce])
        self._store.advance_schedule(schedule.name, due.last)
        # Should another leader have gone further, the ticks this copy repeats are refused by
        # their unique keys; the next read of the table brings the copy up to date.
        self._schedules[index] = dataclasses.replace(schedule, last_tick=due.last)
        return len(due.produce)
