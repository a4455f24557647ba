"""The workflow row in memory, as ``storages/workflows.py`` keeps it in SQL: created by a
submission of steps, lowered in the operation that ends each step, read by id (cancelling
workflows whole is in ``dependencies.py``). The state's one lock makes each operation atomic,
so one operation ends a workflow."""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Mapping, Optional, Sequence

from tidemq.dependencies import WorkflowState
from tidemq.lifecycle import MessageStatus
from tidemq.tables import MESSAGE as M
from tidemq.tables import WORKFLOW as W

from ...records import WorkflowRecord
from ..workflow_tally import Tally, final_state
from .state import MemoryState

__all__ = ["create_workflow", "settle", "MemoryWorkflows"]

_OPEN = {MessageStatus.NEW.value, MessageStatus.WAITING.value, MessageStatus.RUNNING.value}


def create_workflow(state: MemoryState, workflow_id: int, policy: str, total: int, stopped: int, failed: int,
                    now: datetime) -> dict[int, str]:
    """The row of a new workflow; {id: state} if its steps stopped at once ended it."""
    state.workflows[workflow_id] = {W.id: workflow_id, W.policy: policy, W.state: WorkflowState.RUNNING.value,
                                    W.steps_total: total, W.steps_left: total, W.steps_failed: 0,
                                    W.created_at: now, W.finished_at: None}
    tally = Tally()
    if stopped:
        tally.add(workflow_id, stopped, failed)
    return settle(state, tally, now)


def settle(state: MemoryState, tally: Tally, now: datetime) -> dict[int, str]:
    """Lower each tallied workflow's steps_left; end those with none left. {id: state} ended."""
    finished: dict[int, str] = {}
    for workflow_id, (ended, failed) in sorted(tally.counts.items()):
        row = state.workflows.get(workflow_id)
        if row is None:
            continue
        row[W.steps_left] -= ended
        row[W.steps_failed] += failed
        if row[W.steps_left] <= 0 and row[W.finished_at] is None:
            row[W.state], row[W.finished_at] = final_state(row[W.state], row[W.steps_failed]), now
            finished[workflow_id] = row[W.state]
    return finished


class MemoryWorkflows:
    """Reading a workflow's row and the topics of its messages; the listeners of its ends."""

    def __init__(self, state: MemoryState) -> None:
        self._state = state

    def workflow(self, workflow_id: int) -> Optional[WorkflowRecord]:
        with self._state.lock:
            row = self._state.workflows.get(workflow_id)
            return WorkflowRecord(**row) if row is not None else None

    def workflow_open_step(self, workflow_id: int) -> Optional[int]:
        with self._state.lock:
            return max((id for id, row in self._state.messages.items()
                        if row[M.workflow_id] == workflow_id and row[M.status] in _OPEN), default=None)

    def workflow_topics(self, workflow_ids: Sequence[int]) -> set[str]:
        wanted = set(workflow_ids)
        with self._state.lock:
            return {row[M.topic] for row in self._state.messages.values() if row[M.workflow_id] in wanted}

    def watch_workflows(self, listener: Callable[[Mapping[str, int]], None]) -> None:
        self._state.outcomes.watch(listener)
