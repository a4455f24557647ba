"""Dependencies between messages in memory: steps inserted with their edges, and what an ack
does to the steps waiting on the messages it finishes, as ``storages/dependencies.py`` does in
SQL. The state's one lock makes each of them atomic, so a fan-in is released once by the ack
that lowers its count to 0."""

from __future__ import annotations

from datetime import datetime
from typing import Mapping, Sequence

from tidemq import dependencies as deps
from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M

from ...records import WorkflowStep
from ..request_ids import id_list, stored_answer
from ..rows import row_values
from ..steps import WAITED_ON, check_known, check_steps, edges, parent_ids, plan
from .state import NOT_NULL, ConstraintError, MemoryState, apply

__all__ = ["MemoryDependencies", "release_after", "stop_after"]

_WAITING = MessageStatus.WAITING.value


class MemoryDependencies:
    """Steps with dependencies, each submission atomic."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def insert_steps(self, steps: Sequence[WorkflowStep], now: datetime, request_id: str = "", **who: object) -> list[int]:
        order = check_steps(steps)
        if not steps:
            return []
        state = self._state
        with state.lock:
            if request_id in state.requests:
                return stored_answer(request_id, id_list(state.requests[request_id][1]), len(steps))
            wanted = parent_ids(steps)
            statuses = {id: state.messages[id][M.status] for id in wanted if id in state.messages}
            check_known(wanted, statuses)
            starts = plan(steps, order, statuses)
            values = [row_values(step.row, deps.waiting(now, start.deps_left, **who))
                      for step, start in zip(steps, starts)]
            for row in values:
                empty = sorted(name for name in NOT_NULL if row[name] is None)
                if empty:  # refused whole, before anything is stored
                    raise ConstraintError(f"column {empty[0]} cannot be NULL")
            ids = []
            for row in values:
                ids.append(state.new_id())
                state.insert({M.id: ids[-1], **row})
            for id in ids:
                state.messages[id][M.workflow_id] = ids[0]
            for id in wanted:
                if statuses[id] in WAITED_ON and state.messages[id][M.workflow_id] is None:
                    state.messages[id][M.workflow_id] = ids[0]
            for parent, child in edges(steps, ids, statuses):
                state.children.setdefault(parent, set()).add(child)
                state.parents.setdefault(child, set()).add(parent)
            for i in order:
                start = starts[i]
                if start.stopped:
                    by = start.by_id if start.by_id is not None else ids[start.by_step or 0]
                    apply(state, deps.dependency_failed(now, by, start.by_status), [state.messages[ids[i]]])
            if request_id:
                state.requests[request_id] = (now, list(ids))
            return ids


def release_after(state: MemoryState, parents: Sequence[int], now: datetime, broker: str) -> dict[int, str]:
    """Under the state's lock, in the ack that recorded the SUCCESS of ``parents``: lower
    ``deps_left`` of their waiting children, release those at 0; returns {id: topic} of them."""
    released: dict[int, str] = {}
    for parent in sorted(set(parents)):
        for child in sorted(state.children.get(parent, ())):
            row = state.messages.get(child)
            if row is None or row[M.status] != _WAITING:
                continue
            row[M.deps_left] -= 1
            if row[M.deps_left] == 0:
                apply(state, deps.released(now, row[M.effect_time], parent, broker), [row])
                released[child] = row[M.topic]
    return released


def stop_after(state: MemoryState, parents: Mapping[int, str], now: datetime, broker: str) -> list[int]:
    """Under the state's lock, in the ack that recorded the FAIL or CANCELLED of ``parents``
    ({id: status}): cancel their waiting children, and theirs in turn; returns the ids."""
    stopped: list[int] = []
    frontier = dict(parents)
    while frontier:
        after: dict[int, str] = {}
        for parent in sorted(frontier):
            for child in sorted(state.children.get(parent, ())):
                row = state.messages.get(child)
                if row is not None and row[M.status] == _WAITING:
                    apply(state, deps.dependency_failed(now, parent, frontier[parent], broker), [row])
                    after[child] = MessageStatus.CANCELLED.value
        stopped.extend(after)
        frontier = after
    return sorted(stopped)
