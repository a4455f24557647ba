"""Dependencies between messages in memory: steps inserted with their edges, and what an ack
does to the steps waiting on the messages it finishes, as ``storages/dependencies.py`` does in
SQL. The state's one lock makes each of them atomic, so a fan-in is released once by the ack
that lowers its count to 0."""

from __future__ import annotations

from datetime import datetime
from typing import Mapping, Optional, Sequence

from tidemq import dependencies as deps
from tidemq import lifecycle
from tidemq.dependencies import WaitMode, WorkflowState
from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M
from tidemq.tables import WORKFLOW as W

from ...records import WorkflowStep, add_released
from ...workflow_store import WorkflowCancel
from ..request_ids import id_list, stored_answer
from ..rows import insert_columns, row_values
from ..steps import WAITED_ON, check_known, check_steps, edges, parent_ids, plan
from ..workflow_tally import Tally, policy_of
from .state import NOT_NULL, ConstraintError, MemoryState, apply
from .edges import MemoryEdges
from .workflows import MemoryWorkflows, create_workflow, settle

__all__ = ["MemoryDependencies", "release_after", "stop_after"]

_WAITING = MessageStatus.WAITING.value
_CANCELLED = MessageStatus.CANCELLED.value


class MemoryDependencies(MemoryWorkflows, MemoryEdges):
    """Steps with dependencies, each submission atomic; and the workflows' rows."""

    def insert_steps(self, steps: Sequence[WorkflowStep], now: datetime, request_id: str = "",
                     **who: object) -> list[int]:
        order = check_steps(steps)
        if not steps:
            return []
        state = self._state
        finished: dict[int, str] = {}
        with state.lock:
            if request_id in state.requests:
                return stored_answer(request_id, id_list(state.requests[request_id][1]), len(steps))
            wanted = parent_ids(steps)
            statuses = {id: state.messages[id][M.status] for id in wanted if id in state.messages}
            check_known(wanted, statuses)
            starts = plan(steps, order, statuses)
            values = [row_values(step.row, insert_columns(deps.waiting(now, start.deps_left, step.wait_mode,
                                                                        start.deps_failed, **who)))
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
            adopted = 0
            for id in wanted:
                if statuses[id] in WAITED_ON and state.messages[id][M.workflow_id] is None:
                    state.messages[id][M.workflow_id] = ids[0]
                    adopted += 1
            for parent, child in edges(steps, ids, statuses):
                state.children.setdefault(parent, set()).add(child)
                state.parents.setdefault(child, set()).add(parent)
            stopped = failed = 0
            for i in order:
                start = starts[i]
                if start.stopped:
                    by = start.by_id if start.by_id is not None else ids[start.by_step or 0]
                    change = (deps.not_needed(now, by) if start.not_needed
                              else deps.dependency_failed(now, by, start.by_status))
                    apply(state, change, [state.messages[ids[i]]])
                    stopped, failed = stopped + 1, failed + (not start.not_needed)
            if request_id:
                state.requests[request_id] = (now, list(ids))
            finished.update(create_workflow(state, ids[0], policy_of(steps), len(ids) + adopted, stopped, failed, now))
        state.outcomes.ended(finished)
        return ids

    def cancel_workflows(self, workflow_ids: Sequence[int], running: bool, now: datetime,
                         topics: Optional[set[str]] = None, released: Optional[dict[str, dict[int, int]]] = None,
                         **who: str) -> list[WorkflowCancel]:
        change, marking = lifecycle.cancel(), lifecycle.request_cancel(now, **who)
        broker = who.get("broker", "")  # the released or stopped dependents' traces name a broker only
        state = self._state
        freed: dict[int, tuple[str, int]] = {}
        with state.lock:
            counts, tally = [], Tally()
            for workflow_id in workflow_ids:
                steps = [row for row in state.messages.values() if row[M.workflow_id] == workflow_id]
                pending = sorted(row[M.id] for row in steps if change.allows(row))
                held = [row for row in steps if running and marking.allows(row) and not row[M.cancel_requested]]
                apply(state, change, [state.messages[id] for id in pending])
                marked = apply(state, marking, held)
                if topics is not None:
                    topics.update(row[M.topic] for row in steps if running and marking.allows(row))
                if pending:
                    tally.add(workflow_id, len(pending), len(pending))
                    freed.update(stop_after(state, {id: lifecycle.CANCELLED.value for id in pending}, now, broker,
                                            tally))
                if steps and workflow_id in state.workflows and state.workflows[workflow_id][W.finished_at] is None:
                    state.workflows[workflow_id][W.state] = WorkflowState.CANCELLED.value
                counts.append(WorkflowCancel(len(pending), marked))
            finished = settle(state, tally, now)
        state.outcomes.ended(finished)
        add_released(released, freed)
        return counts


def release_after(state: MemoryState, parents: Sequence[int], now: datetime, broker: str,
                  tally: Optional[Tally] = None,
                  due: Optional[dict[str, list[tuple[int, int, datetime]]]] = None) -> dict[int, tuple[str, int]]:
    """Under the state's lock, in the ack that recorded the SUCCESS of ``parents``: lower
    ``deps_left`` of their waiting children, release those at 0 (or cancel, as not needed, one
    waiting after failure with none failed, and walk on from it); returns {id: (topic,
    priority)} released, and adds those due now to ``due`` ({topic: [(id, priority, time)]})."""
    released: dict[int, tuple[str, int]] = {}
    unneeded: dict[int, str] = {}
    for parent in sorted(set(parents)):
        for child in sorted(state.children.get(parent, ())):
            row = state.messages.get(child)
            if row is None or row[M.status] != _WAITING:
                continue
            row[M.deps_left] -= 1
            if row[M.deps_left] == 0:
                if row[M.wait_mode] == WaitMode.AFTER_FAILURE and row[M.deps_failed] == 0:
                    apply(state, deps.not_needed(now, parent, broker), [row])
                    unneeded[child] = _CANCELLED
                    if tally is not None and row[M.workflow_id] is not None:
                        tally.end(row[M.workflow_id], _CANCELLED, failed=False)
                else:
                    apply(state, deps.released(now, row[M.effect_time], parent, broker), [row])
                    released[child] = (row[M.topic], row[M.priority])
                    if due is not None and row[M.effect_time] <= now:
                        due.setdefault(row[M.topic], []).append((child, row[M.priority], row[M.effect_time]))
    if unneeded:
        released.update(stop_after(state, unneeded, now, broker, tally))
    return released


def stop_after(state: MemoryState, parents: Mapping[int, str], now: datetime, broker: str,
               tally: Optional[Tally] = None) -> dict[int, tuple[str, int]]:
    """Under the state's lock, in the operation that recorded the FAIL or CANCELLED of
    ``parents`` ({id: status}): cancel their waiting children that wait after success, and
    theirs in turn; count the failure as ended for the others, releasing those with nothing
    left. Returns {id: (topic, priority)} of the messages released."""
    released: dict[int, tuple[str, int]] = {}
    frontier = dict(parents)
    while frontier:
        after: dict[int, str] = {}
        for parent in sorted(frontier):
            for child in sorted(state.children.get(parent, ())):
                row = state.messages.get(child)
                if row is None or row[M.status] != _WAITING:
                    continue
                if row[M.wait_mode] == WaitMode.AFTER_SUCCESS:
                    apply(state, deps.dependency_failed(now, parent, frontier[parent], broker), [row])
                    after[child] = _CANCELLED
                    if tally is not None and row[M.workflow_id] is not None:
                        tally.end(row[M.workflow_id], _CANCELLED)
                    continue
                row[M.deps_left] -= 1
                row[M.deps_failed] += 1
                if row[M.deps_left] == 0:
                    apply(state, deps.released(now, row[M.effect_time], parent, broker), [row])
                    released[child] = (row[M.topic], row[M.priority])
        frontier = after
    return released
