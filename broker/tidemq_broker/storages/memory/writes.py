"""Produce and the operators' changes in memory: insert (unique keys, request ids), cancel,
requeue, edit, delete, retention, cancel requests of running messages and result retention; each
applies the lifecycle's Change as the SQL storage does."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, Sequence

from tidemq import clock, lifecycle
from tidemq import dependencies as deps
from tidemq.lifecycle import Event
from tidemq.tables import MESSAGE as M

from ...records import HandOff, MessageEdit, NewRow, RequestRef, StoredMessage, add_released
from ..request_ids import Claims
from ..rows import edit_change, insert_columns, row_values, to_message
from ..workflow_tally import Tally
from .dependencies import release_after, stop_after
from .leases import hand_off
from .state import NOT_NULL, ConstraintError, MemoryState, apply
from .workflows import settle

__all__ = ["MemoryWrites"]

_UNRUN = (lifecycle.NEW.value, lifecycle.WAITING.value)
_FINAL = frozenset(status.value for status in lifecycle.FINAL_STATUSES)
_CHUNK = 1000  # as the SQL storage: requeue by id moves the first 1000 of the ids


class MemoryWrites:
    """Inserts and the transitions operators and producers start."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def insert_messages(self, rows: Sequence[NewRow], now: datetime, requests: Sequence[RequestRef] = (),
                        handoff: Optional[HandOff] = None, **who: object) -> list[int]:
        change = lifecycle.produce(now, **who)
        state = self._state
        with state.lock:
            stored = {ref.request_id: state.requests[ref.request_id][1] for ref in requests
                      if ref.request_id in state.requests}
            claims = Claims.of(requests, stored)
            skip = claims.skipped()
            columns = insert_columns(change)
            values = {i: row_values(row, columns) for i, row in enumerate(rows) if i not in skip}
            for row in values.values():
                empty = sorted(name for name in NOT_NULL if row[name] is None)
                if empty:  # refused whole, before anything is stored
                    raise ConstraintError(f"column {empty[0]} cannot be NULL")
            ids: list[int] = [0] * len(rows)
            for ref, found in claims.answered.items():
                ids[ref.start : ref.start + ref.count] = found
            # As the SQL storage inserts them: the rows without a unique key first, in order,
            # then the keyed ones, each (topic, unique_key) stored once and its id shared.
            plain = [i for i in values if not values[i][M.unique_key]]
            keyed = [i for i in values if values[i][M.unique_key]]
            for i in plain:
                ids[i] = self._insert(values[i])
            for i in keyed:
                key = (values[i][M.topic], values[i][M.unique_key])
                ids[i] = state.unique[key] if key in state.unique else self._insert(values[i])
            for repeat, original in claims.repeats:
                ids[repeat.start : repeat.start + repeat.count] = ids[original.start : original.start + original.count]
            for ref in claims.ours:
                state.requests[ref.request_id] = (now, ids[ref.start : ref.start + ref.count])
            if handoff is not None:
                handoff.begin()
                due: dict[str, list[tuple[int, int, datetime]]] = {}
                for i in plain:  # keyed rows may be old ones
                    due.setdefault(rows[i].topic, []).append((ids[i], rows[i].priority, rows[i].effect_time))
                hand_off(state, handoff, due)
                handoff.committed()
            return ids

    def _insert(self, values: dict[str, Any]) -> int:
        id = self._state.new_id()
        self._state.insert({M.id: id, **values})
        return id

    def delete_produce_requests(self, before: datetime, limit: int) -> int:
        with self._state.lock:
            old = [name for name, (created, _) in self._state.requests.items() if created < before][:limit]
            for name in old:
                del self._state.requests[name]
            return len(old)

    def cancel(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None,
               running_at: Optional[datetime] = None, topics: Optional[set[str]] = None,
               **who: object) -> list[bool]:
        change = lifecycle.cancel()
        marking = lifecycle.request_cancel(running_at, **who) if running_at is not None else None
        state = self._state
        with state.lock:
            pending = {i for i in set(ids) if i in state.messages and change.allows(state.messages[i])}
            held = {i for i in set(ids) if marking is not None and i in state.messages
                    and marking.allows(state.messages[i])}
            waited = {i: state.messages[i][M.workflow_id] for i in pending
                      if state.messages[i][M.workflow_id] is not None}
            apply(state, change, [state.messages[i] for i in pending])
            if marking is not None:  # once each: a repeated request adds no trace line
                apply(state, marking, [state.messages[i] for i in sorted(held)
                                       if not state.messages[i][M.cancel_requested]])
            if topics is not None:
                topics.update(state.messages[i][M.topic] for i in held)
            # A message waited on is gone: what waits on it would otherwise wait for ever.
            freed: dict[int, tuple[str, int]] = {}
            finished = _ended(state, waited, freed)
        state.outcomes.ended(finished)
        add_released(released, freed)
        return [i in pending or i in held for i in ids]

    def requeue(self, ids: Sequence[int], topic: Optional[str], retry: int, now: datetime,
                event: Event = Event.REQUEUED, topics: Optional[set[str]] = None, **who: object) -> int:
        change = lifecycle.requeue(now, retry, event, **who)
        state = self._state
        with state.lock:
            if ids:
                chosen = [state.messages[i] for i in sorted(set(ids)) if i in state.messages]
                rows = [row for row in chosen if change.allows(row)][:_CHUNK]
            else:
                rows = [row for row in state.rows(topic) if change.allows(row)] if topic else []
            if topics is not None:
                topics.update(row[M.topic] for row in rows)
            return apply(state, change, rows)

    def edit_message(self, id: int, version: int, edit: MessageEdit, now: datetime, user: str, changed: Sequence[str],
                     released: Optional[dict[str, dict[int, int]]] = None) -> Optional[StoredMessage]:
        change = edit_change(edit, now, user, changed)
        with self._state.lock:
            row = self._state.messages.get(id)
            if row is None or row[M.version] != version:
                return None
            status_before = row[M.status]
            ends = deps.edited(id, status_before, edit.status, bool(self._state.children.get(id)))
            if apply(self._state, change, [row]) != 1:
                return None
            tally = Tally()
            if row[M.workflow_id] is not None and status_before in _UNRUN and edit.status in _FINAL:
                tally.end(row[M.workflow_id], edit.status)  # a step ended by hand
            freed: dict[int, tuple[str, int]] = {}
            if ends is lifecycle.SUCCESS:
                freed = release_after(self._state, [id], now, "", tally)
            elif ends is not None:
                freed = stop_after(self._state, {id: ends.value}, now, "", tally)
            finished = settle(self._state, tally, now) if tally else {}
            edited = to_message(row)
        self._state.outcomes.ended(finished)
        add_released(released, freed)
        return edited

    def delete_messages(self, ids: Sequence[int], released: Optional[dict[str, dict[int, int]]] = None) -> int:
        with self._state.lock:
            rows = [self._state.messages[i] for i in set(ids) if i in self._state.messages]
            # Messages not run yet that others wait on: those would otherwise wait for ever.
            waited = {row[M.id]: row[M.workflow_id] for row in rows
                      if row[M.workflow_id] is not None and row[M.status] in _UNRUN}
            deleted = apply(self._state, lifecycle.admin_delete(), rows)
            freed: dict[int, tuple[str, int]] = {}
            finished = _ended(self._state, waited, freed)
        self._state.outcomes.ended(finished)
        add_released(released, freed)
        return deleted

    def delete_finished(self, topic: str, before: datetime, limit: int) -> int:
        change = lifecycle.retire()
        with self._state.lock:
            old = [row for row in self._state.rows(topic) if change.allows(row) and row[M.finish_time] is not None
                   and row[M.finish_time] < before][:limit]
            return apply(self._state, change, old)

    def forget_results(self, topic: str, before: datetime, limit: int) -> int:
        change = lifecycle.forget_result(before)
        with self._state.lock:
            old = [row for row in self._state.rows(topic) if change.allows(row) and row[M.finish_time] is not None
                   and row[M.finish_time] < before and (row[M.result] is not None or row[M.progress] is not None)]
            return apply(self._state, change, old[:limit])


def _ended(state: MemoryState, gone: dict[int, int],
           freed: Optional[dict[int, tuple[str, int]]] = None) -> dict[int, str]:
    """Under the state's lock: messages of workflows ({id: workflow id}) removed before they
    ran. What waits on them learns they ended CANCELLED, their workflows count them ended;
    ``freed`` gets {id: (topic, priority)} of the steps this released."""
    now, tally = clock.now(), Tally()
    tally.end_many((workflow_id, lifecycle.CANCELLED.value) for workflow_id in gone.values())
    released = stop_after(state, {id: lifecycle.CANCELLED.value for id in gone}, now, "", tally)
    if freed is not None:
        freed.update(released)
    return settle(state, tally, now)
