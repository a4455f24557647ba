"""Topic settings, message lookups and counts in memory."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Optional, Sequence

from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

from ...records import Backlog, FlowLimits, MessageResult, StoredMessage, TopicSettings
from ..rows import to_message
from .state import MemoryState

__all__ = ["MemoryTopics", "MemoryReads", "MemoryCounts", "topic_row"]

_NEW, _RUNNING = MessageStatus.NEW.value, MessageStatus.RUNNING.value
_SETTINGS = [field.name for field in dataclasses.fields(TopicSettings)]


def topic_row(settings: TopicSettings, now: datetime) -> dict[str, Any]:
    """The topic row of ``settings``, created ``now``, its rate's bucket full (no tokens counted)."""
    return {**dataclasses.asdict(settings), "add_time": now, "update_time": now, "rate_tokens": None, "rate_at": None}


class MemoryTopics:
    """Topic settings: created with defaults, listed, saved, and their flow limits set."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def ensure_topics(self, names: Sequence[str], now: datetime) -> None:
        with self._state.lock:
            for name in sorted(set(names) - set(self._state.topics)):
                self._state.topics[name] = topic_row(TopicSettings(name), now)

    def list_topics(self) -> list[TopicSettings]:
        with self._state.lock:
            return [TopicSettings(**{name: row[name] for name in _SETTINGS})
                    for _, row in sorted(self._state.topics.items())]

    def save_topic(self, settings: TopicSettings, now: datetime) -> None:
        with self._state.lock:
            row = self._state.topics.get(settings.name)
            if row is None:
                self._state.topics[settings.name] = topic_row(settings, now)
            else:
                row.update(dataclasses.asdict(settings), update_time=now)

    def set_topic_limits(self, name: str, limits: FlowLimits, now: datetime) -> None:
        with self._state.lock:
            self.ensure_topics([name], now)
            # A new rate starts with a full bucket rather than the old rate's leftovers.
            self._state.topics[name].update(max_running=limits.max_running, rate_per_second=limits.rate_per_second,
                                            max_running_per_key=limits.max_running_per_key, rate_tokens=None,
                                            rate_at=None, update_time=now)


class MemoryReads:
    """Messages by id, and the topics of messages or of a lease."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def get_message(self, id: int) -> Optional[StoredMessage]:
        with self._state.lock:
            row = self._state.messages.get(id)
            return to_message(row) if row is not None else None

    def message_topics(self, ids: Sequence[int]) -> set[str]:
        with self._state.lock:
            return {self._state.messages[i][M.topic] for i in set(ids) if i in self._state.messages}

    def lease_topics(self, lease_token: str) -> set[str]:
        with self._state.lock:
            return {row[M.topic] for row in self._state.rows(status=_RUNNING) if row[M.lease_token] == lease_token}

    def get_results(self, ids: Sequence[int]) -> list[MessageResult]:
        with self._state.lock:
            rows = [self._state.messages[i] for i in sorted(set(ids)) if i in self._state.messages]
            return [MessageResult(row[M.id], row[M.topic], row[M.status], row[M.result], row[M.progress],
                                  row[M.effect_time], row[M.finish_time], bool(row[M.cancel_requested]))
                    for row in rows]


class MemoryCounts:
    """Messages per topic and status: the backlog, a count, the leader's stored count."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def backlog(self, now: datetime) -> list[Backlog]:
        found: dict[str, dict[str, Any]] = {}
        with self._state.lock:
            for row in self._state.rows():
                if row[M.status] not in (_NEW, _RUNNING):
                    continue
                entry = found.setdefault(row[M.topic], {"due": 0, "scheduled": 0, "running": 0, "oldest_due": None})
                if row[M.status] == _RUNNING:
                    entry["running"] += 1
                elif row[M.effect_time] <= now:
                    entry["due"] += 1
                    if entry["oldest_due"] is None or row[M.effect_time] < entry["oldest_due"]:
                        entry["oldest_due"] = row[M.effect_time]
                else:
                    entry["scheduled"] += 1
        return [Backlog(topic, **values) for topic, values in sorted(found.items())]

    def count_by_status(self, topic: Optional[str] = None) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        with self._state.lock:
            for row in self._state.rows(topic or None):
                by_status = counts.setdefault(row[M.topic], {})
                by_status[row[M.status]] = by_status.get(row[M.status], 0) + 1
        return counts

    def save_topic_counts(self, counts: dict[str, dict[str, int]], now: datetime) -> None:
        with self._state.lock:
            self._state.topic_counts = [(topic, status, n, now) for topic, by_status in counts.items()
                                        for status, n in by_status.items()]
