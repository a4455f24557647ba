"""The console's reads of workflows in memory, as ``storages/workflow_reads.py`` reads them in
SQL: a page takes the workflows whose ids fall in the same bounded window of ids, each with the
steps at or above its id, and the graph adds the messages stored before that its steps wait on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from tidemq.tables import MESSAGE as M

from ...records import SCAN_WINDOW
from ...workflow_view import WorkflowGraph, WorkflowNode, WorkflowPage, WorkflowSummary, graph, summarize
from .state import MemoryState

__all__ = ["MemoryWorkflowReads"]


def _step(row: dict[str, Any]) -> Any:
    return SimpleNamespace(status=row[M.status], add_time=row[M.add_time], update_time=row[M.update_time])


class MemoryWorkflowReads:
    """The workflow reads of the console's component (``MemoryConsole`` inherits them)."""

    _state: MemoryState

    def workflow_page(self, state: Optional[str], limit: int, before_id: Optional[int] = None,
                      window: int = SCAN_WINDOW) -> WorkflowPage:
        with self._state.lock:
            messages = self._state.messages
            top = before_id if before_id is not None else max(messages, default=0) + 1
            floor = max(top - window, 0)
            steps: dict[int, list[Any]] = {}
            for id, row in messages.items():
                wf = row[M.workflow_id]
                if wf is not None and floor <= wf < top and id >= wf:
                    steps.setdefault(wf, []).append(_step(row))
        found = [summary for summary in (summarize(id, steps[id]) for id in sorted(steps, reverse=True))
                 if state is None or summary.state == state]
        if len(found) > limit:
            return WorkflowPage(found[:limit], found[limit - 1].id, floor)
        return WorkflowPage(found, floor if floor > 1 else None, floor)

    def workflow_graph(self, workflow_id: int, limit: int) -> Optional[WorkflowGraph]:
        with self._state.lock:
            rows = {id: row for id, row in self._state.messages.items()
                    if id >= workflow_id and row[M.workflow_id] == workflow_id}
            if not rows:
                return None
            summary: WorkflowSummary = summarize(workflow_id, [_step(row) for row in rows.values()])
            edges = [(parent, child) for parent, children in self._state.children.items()
                     for child in children if child in rows]
            for parent, _ in edges:
                row = self._state.messages.get(parent)
                if row is not None and row[M.workflow_id] == workflow_id:
                    rows[parent] = row
            nodes = [WorkflowNode(id, row[M.topic], row[M.status], bool(row[M.cancel_requested]))
                     for id, row in rows.items()]
        return graph(summary, nodes, edges, limit)
