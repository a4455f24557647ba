"""The console's reads in memory: users, keyset pages of messages, the dashboard's figures.

Pages keep the SQL store's contract, the bounded scan included: a filter no index answers there
(text, time ranges) examines at most ``window`` ids per page here too, so a page and its
``scanned_from`` are the same on every storage. The pipeline's tables (hourly stats, alarms)
are written by the Spark jobs over JDBC, which a memory storage has none of: they read empty.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional, Sequence

from tidemq.lifecycle import FINAL_STATUSES, STATUSES, MessageStatus
from tidemq.tables import MESSAGE as M

from ...records import (COUNTED_FROM, SCAN_WINDOW, AdminUser, MessageFilter, MessagePage, MessageResult, TopicBacklog,
                        TopicCounts)
from ..rows import to_message
from .state import MemoryState
from .workflow_reads import MemoryWorkflowReads

__all__ = ["MemoryConsole"]

Row = dict[str, Any]


def _matcher(flt: MessageFilter) -> tuple[Callable[[Row], bool], bool]:
    """A test of ``flt``'s criteria, and whether any of them is one SQL checks row by row."""
    text = flt.text.casefold() if flt.text else None
    checks: list[Callable[[Row], bool]] = []
    if flt.id is not None:
        checks.append(lambda row: row[M.id] == flt.id)
    if flt.topic:
        checks.append(lambda row: row[M.topic] == flt.topic)
    if flt.status:
        checks.append(lambda row: row[M.status] == flt.status)
    if flt.unique_key:
        checks.append(lambda row: row[M.unique_key] == flt.unique_key)
    residual: list[Callable[[Row], bool]] = []
    if flt.effect_from:
        residual.append(lambda row: row[M.effect_time] >= flt.effect_from)
    if flt.effect_to:
        residual.append(lambda row: row[M.effect_time] < flt.effect_to)
    if flt.added_from:
        residual.append(lambda row: row[M.add_time] >= flt.added_from)
    if flt.added_to:
        residual.append(lambda row: row[M.add_time] < flt.added_to)
    if text is not None:  # LIKE '%text%' under a case-insensitive collation
        residual.append(lambda row: text in row[M.data].casefold())
    every = checks + residual
    return (lambda row: all(check(row) for check in every)), bool(residual)


class MemoryConsole(MemoryWorkflowReads):
    """Console users, pages of messages, the dashboard's figures (and workflows: ``workflows.py``)."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    # -- users -------------------------------------------------------------------------------
    def get_user(self, name: str) -> Optional[AdminUser]:
        with self._state.lock:
            return self._state.users.get(name)

    def users(self) -> list[AdminUser]:
        with self._state.lock:
            return [user for _, user in sorted(self._state.users.items())]

    def save_user(self, name: str, password_hash: str, role: str, now: datetime) -> bool:
        with self._state.lock:
            created = name not in self._state.users
            self._state.users[name] = AdminUser(name, password_hash, role)
            if not created:  # a new password ends every session signed in with the old one
                for key in [k for k, row in self._state.sessions.items() if row["user_name"] == name]:
                    del self._state.sessions[key]
            return created

    # -- listing -----------------------------------------------------------------------------
    def list_page(self, flt: MessageFilter, limit: int, before_id: Optional[int] = None,
                  window: int = SCAN_WINDOW) -> MessagePage:
        matches, residual = _matcher(flt)
        with self._state.lock:
            if not self._state.messages and not flt.topic and flt.id is None and (flt.status or flt.unique_key):
                return MessagePage([], None)  # SQL finds no topic to walk: no page, and no scan either
            floor: Optional[int] = None
            if residual and flt.id is None:
                top = before_id if before_id is not None else max(self._state.messages, default=0) + 1
                floor = max(top - window, 0)
            found = [id for id, row in reversed(self._state.messages.items())
                     if (before_id is None or id < before_id) and (floor is None or id >= floor) and matches(row)]
            found = sorted(found, reverse=True)[:limit + 1]
            rows = [to_message(self._state.messages[id]) for id in found[:limit]]
        if len(found) > limit:
            return MessagePage(rows, found[limit - 1], floor)
        return MessagePage(rows, floor if floor is not None and floor > 1 else None, floor)

    def matching_ids(self, flt: MessageFilter, after_id: int, limit: int) -> list[int]:
        matches, _ = _matcher(flt)
        with self._state.lock:
            return sorted(id for id, row in self._state.messages.items() if id > after_id and matches(row))[:limit]

    # -- dashboard ---------------------------------------------------------------------------
    def results_page(self, topic: str, limit: int, before_id: Optional[int] = None) -> list[MessageResult]:
        final = {status.value for status in FINAL_STATUSES}
        with self._state.lock:
            rows = [row for row in self._state.rows(topic) if row[M.status] in final and row[M.result] is not None
                    and (before_id is None or row[M.id] < before_id)]
            rows = sorted(rows, key=lambda row: row[M.id], reverse=True)[:limit]
            return [MessageResult(row[M.id], row[M.topic], row[M.status], row[M.result], row[M.progress],
                                  row[M.effect_time], row[M.finish_time], bool(row[M.cancel_requested]))
                    for row in rows]

    def topics_present(self) -> list[str]:
        with self._state.lock:
            return sorted({row[M.topic] for row in self._state.rows()})

    def topic_counts(self, known: Optional[dict[str, dict[str, int]]] = None,
                     topics: Optional[Sequence[str]] = None) -> TopicCounts:
        known = known or {}
        known_statuses = {status for by_status in known.values() for status in by_status}
        with self._state.lock:
            present = set(topics) if topics is not None else {row[M.topic] for row in self._state.rows()}
            stored: dict[str, dict[str, int]] = {}
            counted_at: Optional[datetime] = None
            for topic, status, n, at in self._state.topic_counts:
                stored.setdefault(status, {})[topic] = n
                counted_at = at if counted_at is None else min(counted_at, at)
            from_store = {status for status, by_topic in stored.items()
                          if sum(by_topic.values()) >= COUNTED_FROM and status not in known_statuses}
            live = {s.value for s in STATUSES if s.value not in from_store and s.value not in known_statuses}
            counts: dict[str, dict[str, int]] = {}
            for row in self._state.rows():
                if row[M.topic] in present and row[M.status] in live:
                    by_status = counts.setdefault(row[M.topic], {})
                    by_status[row[M.status]] = by_status.get(row[M.status], 0) + 1
        for status in from_store:
            for topic, n in stored[status].items():
                counts.setdefault(topic, {})[status] = n
        for topic, by_status in known.items():
            counts.setdefault(topic, {}).update({status: n for status, n in by_status.items() if n})
        return TopicCounts(counts, sorted(from_store), counted_at if from_store else None)

    def backlog(self, topics: Sequence[str], now: datetime) -> dict[str, TopicBacklog]:
        out = {name: TopicBacklog(0, 0, None) for name in topics}
        with self._state.lock:
            for row in self._state.rows(status=MessageStatus.NEW.value):
                entry = out.get(row[M.topic])
                if entry is None:
                    continue
                if row[M.effect_time] <= now:
                    entry.due += 1
                    if entry.oldest_due is None or row[M.effect_time] < entry.oldest_due:
                        entry.oldest_due = row[M.effect_time]
                else:
                    entry.scheduled += 1
        return out

    def topic_stats(self, since: datetime) -> dict[str, list[dict[str, Any]]]:
        return {}

    def open_alarms(self, limit: int = 50) -> list[dict[str, Any]]:
        return []
