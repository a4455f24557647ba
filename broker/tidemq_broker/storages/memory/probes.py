"""The pull hub's probes in memory: next due times (with the lock hints), the earliest NEW
messages of topics, the highest id, the id step and the inserts above a mark."""

from __future__ import annotations

from datetime import datetime
from typing import Optional, Sequence

from tidemq import clock
from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

from ...records import RecentInserts, Shard
from .state import MemoryState

__all__ = ["MemoryProbes"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value


class MemoryProbes:
    """Next due times, the earliest NEW messages of topics, the highest id, recent inserts."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def finished(self, ids: Sequence[int]) -> list[int]:
        with self._state.lock:
            messages = self._state.messages
            return [i for i in sorted(set(ids)) if i not in messages or messages[i][M.status] not in (_NEW, _RUNNING)]

    def next_due(self, shard: Shard) -> Optional[datetime]:
        hint = shard.hint
        times: list[datetime] = []
        with self._state.lock:
            for row in self._state.rows(shard.topic, _NEW):
                when = row[M.effect_time]
                if hint.priorities is not None and row[M.priority] not in hint.priorities:
                    continue
                mine = shard.total <= 1 or self._state.shard_of(row[M.id], shard.total) == shard.rank
                floor = hint.floor_of(row[M.priority]) if mine else hint.floor
                if floor is not None and when < floor:
                    continue
                if mine:
                    times.append(when)
                elif hint.stranded > 0:  # another shard's: a lock takes it once stranded
                    times.append(clock.after(when, hint.stranded))
        return min(times, default=None)

    def earliest_new(self, topics: Sequence[str]) -> dict[str, dict[int, datetime]]:
        wanted = set(topics)
        found: dict[str, dict[int, datetime]] = {}
        with self._state.lock:
            for row in self._state.rows(status=_NEW):
                if row[M.topic] in wanted:
                    by_priority = found.setdefault(row[M.topic], {})
                    when = by_priority.get(row[M.priority])
                    if when is None or row[M.effect_time] < when:
                        by_priority[row[M.priority]] = row[M.effect_time]
        return found

    def serial_head_due(self, topic: str) -> Optional[datetime]:
        with self._state.lock:
            if any(True for _ in self._state.rows(topic, _RUNNING)):
                return None
            head = min(self._state.rows(topic, _NEW), key=lambda row: (row[M.order_time], row[M.id]), default=None)
            return head[M.effect_time] if head is not None else None

    def max_id(self) -> int:
        with self._state.lock:
            return max(self._state.messages, default=0)

    def id_step(self) -> int:
        return self._state.id_step

    def recent_inserts(self, after: int, missing: Sequence[int], limit: int) -> RecentInserts:
        gaps = set(missing)
        with self._state.lock:
            rows = [row for id, row in sorted(self._state.messages.items()) if id > after or id in gaps][:limit]
            top = max(self._state.messages, default=0)
        groups: dict[tuple[str, int], tuple[datetime, list[int]]] = {}
        for row in rows:
            key = (row[M.topic], row[M.priority])
            when, ids = groups.get(key, (row[M.effect_time], []))
            ids.append(row[M.id])
            groups[key] = (min(when, row[M.effect_time]), ids)
        return RecentInserts([(topic, priority, when, ids) for (topic, priority), (when, ids) in groups.items()], top)
