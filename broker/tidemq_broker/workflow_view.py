"""What the console reads of workflows: a workflow's summary and state, a page of them, and one
workflow's graph (``ConsoleStore.workflow_page`` and ``ConsoleStore.workflow_graph`` return them).

A workflow is the messages that share a ``workflow_id``: the steps of one submission (the id of
its first step is the workflow's id), whose statuses make its counts and its derived state
(:func:`workflow_state`), and the messages stored before that its steps wait on and that had no
workflow yet, which its graph draws too (they are not its steps: the list does not count them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence

from tidemq.lifecycle import MessageStatus

__all__ = ["WORKFLOW_STATES", "GRAPH_NODES", "workflow_state", "WorkflowSummary", "WorkflowPage", "WorkflowNode",
           "WorkflowGraph", "summarize", "graph"]

RUNNING, SUCCEEDED, FAILED, CANCELLED = "running", "succeeded", "failed", "cancelled"
#: Every state a workflow can be in, as the console's filter offers them.
WORKFLOW_STATES = (RUNNING, SUCCEEDED, FAILED, CANCELLED)
#: The steps a workflow's graph draws at most (the first by id); the others are counted.
GRAPH_NODES = 500

_UNFINISHED = {MessageStatus.NEW.value, MessageStatus.WAITING.value, MessageStatus.RUNNING.value}


def workflow_state(counts: Mapping[str, int]) -> str:
    """The state of a workflow whose steps are ``counts`` ({status: n}): running while a step is
    NEW, WAITING or RUNNING; else failed when a step is FAIL, cancelled when one is CANCELLED,
    succeeded when all succeeded. A step that failed outranks one a policy cancelled after it."""
    present = {status for status, n in counts.items() if n}
    if present & _UNFINISHED:
        return RUNNING
    if MessageStatus.FAIL.value in present:
        return FAILED
    if MessageStatus.CANCELLED.value in present:
        return CANCELLED
    return SUCCEEDED


@dataclass(frozen=True)
class WorkflowSummary:
    """One workflow: its id, how many steps it has in each status, when its first step was
    produced and when a step last changed."""

    id: int
    counts: dict[str, int]
    first_created: datetime
    last_updated: datetime

    @property
    def steps(self) -> int:
        """How many steps are stored."""
        return sum(self.counts.values())

    @property
    def state(self) -> str:
        """The derived state (:func:`workflow_state`)."""
        return workflow_state(self.counts)


@dataclass
class WorkflowPage:
    """One page of workflows, newest (highest id) first. ``next_before_id`` continues the list
    (None: nothing older); ``scanned_from`` is the lowest message id examined: a page examines a
    bounded window of ids, so it may hold fewer workflows than asked while older ones exist."""

    workflows: list[WorkflowSummary]
    next_before_id: Optional[int]
    scanned_from: Optional[int] = None


@dataclass(frozen=True)
class WorkflowNode:
    """One step as the graph draws it (``cancel_requested``: a RUNNING one marked cancelled)."""

    id: int
    topic: str
    status: str
    cancel_requested: bool = False


@dataclass
class WorkflowGraph:
    """A workflow's messages (at most the limit asked, the first by id), the edges among them
    (parent id, child id: the child waits on the parent) and how many were left out."""

    summary: WorkflowSummary
    nodes: list[WorkflowNode] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    hidden: int = 0


def summarize(workflow_id: int, steps: Iterable[Any]) -> WorkflowSummary:
    """The summary of a workflow from its steps (each with ``status``, ``add_time`` and
    ``update_time`` attributes); there is at least one."""
    counts: dict[str, int] = {}
    first: Optional[datetime] = None
    last: Optional[datetime] = None
    for step in steps:
        counts[step.status] = counts.get(step.status, 0) + 1
        first = step.add_time if first is None else min(first, step.add_time)
        last = step.update_time if last is None else max(last, step.update_time)
    assert first is not None and last is not None, "a workflow has a step"
    return WorkflowSummary(workflow_id, counts, first, last)


def graph(summary: WorkflowSummary, nodes: Sequence[WorkflowNode], edges: Iterable[tuple[int, int]],
          limit: int) -> WorkflowGraph:
    """The graph of ``nodes`` cut to the first ``limit`` by id, with the ``edges`` among those."""
    drawn = sorted(nodes, key=lambda node: node.id)[:limit]
    shown = {node.id for node in drawn}
    return WorkflowGraph(summary, drawn, sorted({(p, c) for p, c in edges if p in shown and c in shown}),
                         len(nodes) - len(drawn))
