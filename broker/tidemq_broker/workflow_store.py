"""The storage's operations on workflows as a whole, part of the ``dependencies`` role
(``storage.DependencyWrites`` extends this protocol): a workflow's row, the topics of its
messages, cancelling it, and who is told of the workflows a commit ended."""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Mapping, NamedTuple, Optional, Protocol, Sequence

from .records import WorkflowRecord

__all__ = ["WorkflowCancel", "WorkflowStore"]


class WorkflowCancel(NamedTuple):
    """What a cancel did to one workflow: its NEW and WAITING messages ``removed``, its RUNNING
    ones ``marked`` cancelled by it (not those marked before)."""

    removed: int
    marked: int


class WorkflowStore(Protocol):
    """Workflows (``tidemq_workflow``): one row per submission of steps, keyed by its workflow id."""

    def workflow(self, workflow_id: int) -> Optional[WorkflowRecord]:
        """The row of workflow ``workflow_id`` (None: no such workflow, or one submitted before
        schema version 13)."""

    def workflow_open_step(self, workflow_id: int) -> Optional[int]:
        """The highest id among the messages of workflow ``workflow_id`` not ended yet (NEW,
        WAITING or RUNNING); None when none is (a wait for the workflow's end waits on it)."""

    def workflow_topics(self, workflow_ids: Sequence[int]) -> set[str]:
        """The topics of the messages of the workflows ``workflow_ids`` (authorizing a cancel)."""

    def cancel_workflows(self, workflow_ids: Sequence[int], running: bool, now: datetime,
                         topics: Optional[set[str]] = None, released: Optional[dict[str, dict[int, int]]] = None,
                         **who: str) -> list[WorkflowCancel]:
        """Cancel each workflow whole, in one transaction: remove its NEW and WAITING messages (what
        waits on them elsewhere learns they ended CANCELLED) and, with ``running``, mark its
        RUNNING ones as ``cancel`` with ``running_at`` does; its state becomes CANCELLED. Returns, per
        workflow, how many messages were removed and how many marked. ``topics``, when given, gets the
        topics of its RUNNING messages with ``running`` (marked now or before: the caller
        signals them). ``released`` ({topic: {id: priority}}, as ``cancel``'s) gets the messages
        of other workflows that waited on the removed ones and are due now. ``who`` names the
        canceller in the traces it writes (``broker=`` or ``user=``, as ``cancel`` takes it)."""

    def forget_orphan_edges(self, after: int, limit: int) -> tuple[int, int]:
        """Delete the dependency edges of messages no longer stored, looking at the edges of up
        to ``limit`` children with ids above ``after``. Returns (the last child id looked at, to
        pass as ``after`` next; 0 when none was above it, to start again; how many were deleted)."""

    def watch_workflows(self, listener: Callable[[Mapping[str, int]], None]) -> None:
        """Call ``listener`` with {state: count} after each commit of this storage that ended
        workflows (the broker's ``tidemq_workflows_finished_total``)."""
