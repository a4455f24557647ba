"""The console's reads of workflows in SQL: a page of workflows and one workflow's graph.

A workflow is read from ``tidemq_message`` grouped by ``workflow_id``, which no index covers:
both reads lean on how ``insert_steps`` numbers a submission instead. The workflow's id is its
first step's id, and every step of the submission is inserted after it, so its steps are the
rows with ``workflow_id = X`` and ``id >= X``: a walk of the primary key from the workflow's id
up, never of the ids below it (the workflow's first step may be gone: a cancel deletes a NEW
one). The messages stored before that the steps wait on (which joined the workflow) are found
through the edges' child index. A page of the list takes the workflows whose ids fall in a
window of ``window`` ids, like the console's other unindexed filters, and counts their steps
along the primary key from the window's floor up: the newest pages are the cheap ones.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import Connection, func, select

from ..records import SCAN_WINDOW
from ..schema import dependency as d
from ..schema import message as m
from ..workflow_view import WorkflowGraph, WorkflowNode, WorkflowPage, WorkflowSummary, graph, summarize
from .database import SqlDatabase
from .ids import ids_in

__all__ = ["SqlWorkflowReads"]

_CHUNK = 1000


class SqlWorkflowReads:
    """The workflow reads of the console's component (``SqlConsole`` inherits them)."""

    _db: SqlDatabase

    def workflow_page(self, state: Optional[str], limit: int, before_id: Optional[int] = None,
                      window: int = SCAN_WINDOW) -> WorkflowPage:
        def work(conn: Connection) -> WorkflowPage:
            top = before_id if before_id is not None else (conn.execute(select(func.max(m.c.id))).scalar() or 0) + 1
            floor = max(top - window, 0)
            found = [s for s in _summaries(conn, floor, top) if state is None or s.state == state]
            if len(found) > limit:
                return WorkflowPage(found[:limit], found[limit - 1].id, floor)
            return WorkflowPage(found, floor if floor > 1 else None, floor)

        return self._db.tx(work)

    def workflow_graph(self, workflow_id: int, limit: int) -> Optional[WorkflowGraph]:
        def work(conn: Connection) -> Optional[WorkflowGraph]:
            cols = (m.c.id, m.c.topic, m.c.status, m.c.cancel_requested, m.c.add_time, m.c.update_time)
            rows = {r.id: r for r in conn.execute(select(*cols).where(m.c.id >= workflow_id,
                                                                      m.c.workflow_id == workflow_id))}
            if not rows:
                return None
            summary = summarize(workflow_id, rows.values())
            edges = _parent_edges(conn, sorted(rows))
            earlier = sorted({p for p, _ in edges if p not in rows})
            for start in range(0, len(earlier), _CHUNK):
                rows.update((r.id, r) for r in conn.execute(select(*cols).where(
                    ids_in(earlier[start : start + _CHUNK]), m.c.workflow_id == workflow_id)))
            nodes = [WorkflowNode(r.id, r.topic, r.status, bool(r.cancel_requested)) for r in rows.values()]
            return graph(summary, nodes, edges, limit)

        return self._db.tx(work)


def _summaries(conn: Connection, floor: int, top: int) -> list[WorkflowSummary]:
    """The workflows whose ids are in [floor, top), newest first: their steps counted per status
    along the primary key from ``floor`` up (a step's id is never below its workflow's)."""
    stats: dict[int, list[Any]] = {}
    for wf, status, n, first, last in conn.execute(
            select(m.c.workflow_id, m.c.status, func.count(), func.min(m.c.add_time), func.max(m.c.update_time))
            .where(m.c.id >= floor, m.c.workflow_id >= floor, m.c.workflow_id < top)
            .group_by(m.c.workflow_id, m.c.status)):
        entry = stats.setdefault(wf, [{}, first, last])
        entry[0][status] = int(n)
        entry[1], entry[2] = min(entry[1], first), max(entry[2], last)
    return [WorkflowSummary(wf, *stats[wf]) for wf in sorted(stats, reverse=True)]


def _parent_edges(conn: Connection, children: list[int]) -> list[tuple[int, int]]:
    """The (parent_id, child_id) edges into ``children``, along the edges' child index."""
    found: list[tuple[int, int]] = []
    for start in range(0, len(children), _CHUNK):
        stmt = select(d.c.parent_id, d.c.child_id).where(d.c.child_id.in_(children[start : start + _CHUNK]))
        found.extend((row.parent_id, row.child_id) for row in conn.execute(stmt))
    return found
