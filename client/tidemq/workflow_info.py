"""What a client reads of a workflow: its row, as :class:`WorkflowInfo` (``Client.workflow_state``,
``AsyncClient.workflow_state``, ``tidemq.workflow_state``, ``tidemq.aio.workflow_state``).

>>> info = tidemq.workflow_state(ids, wait=30)      # doctest: +SKIP
>>> info.state, info.steps_left, info.steps_failed  # doctest: +SKIP

A workflow is named by its id, the id of its first step (or a handle of that step, or what
``submit`` and a shape's ``produce`` returned). Waiting is the broker's long-poll (the Workflow
call, woken by the commit of the workflow's last step), one call per at most ``MAX_WAIT``
seconds; nothing polls on this side.
"""

from __future__ import annotations

import math
from time import monotonic
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from .clock import from_epoch_ms
from .dependencies import FailurePolicy, WorkflowState
from .errors import MalformedRequestError, MessageNotFoundError
from .limits import MAX_WAIT
from .rpc import tidemq_pb2 as pb
from .rpc_build import workflow_id

__all__ = ["WorkflowInfo", "workflow_request", "workflow_info", "Waiting"]


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow's row: its failure policy, its state (RUNNING until its last step ended, then
    SUCCEEDED, FAILED or CANCELLED; CANCELLED at once when cancelled whole), how many steps it
    has, how many have not ended (``steps_left``) and how many ended FAIL or CANCELLED, when it
    was submitted and when it ended (None while a step is left). Times are naive UTC, as a
    message's are."""

    id: int
    policy: FailurePolicy
    state: WorkflowState
    steps_total: int
    steps_left: int
    steps_failed: int
    created_at: datetime
    finished_at: Optional[datetime]

    @property
    def finished(self) -> bool:
        """True once no step of the workflow is left (what a wait waits for)."""
        return self.finished_at is not None


def workflow_request(workflow: Any, wait: float) -> pb.WorkflowRequest:
    return pb.WorkflowRequest(id=workflow_id(workflow), wait_seconds=wait)


def workflow_info(id: int, reply: pb.WorkflowReply) -> WorkflowInfo:
    """The broker's answer about workflow ``id``; MessageNotFoundError when it has none."""
    if not reply.found:
        raise MessageNotFoundError(f"workflow {id} is not stored: no submission's first step has that id, or it "
                                   "was submitted before schema version 13")
    return WorkflowInfo(id, FailurePolicy(reply.policy), WorkflowState(reply.state), reply.steps_total,
                        reply.steps_left, reply.steps_failed, from_epoch_ms(reply.created_ms),
                        from_epoch_ms(reply.finished_ms) if reply.finished_ms else None)


class Waiting:
    """The calls of one wait of up to ``wait`` seconds (None: as long as it takes), each a
    long-poll of at most MAX_WAIT: ``next()`` is the next call's wait, ``over(info)`` whether
    to stop after its answer."""

    def __init__(self, wait: Optional[float]) -> None:
        if wait is not None and not (isinstance(wait, (int, float)) and not math.isnan(wait) and wait >= 0):
            raise MalformedRequestError(f"wait is a number of seconds, 0 or more (None: until the workflow "
                                        f"ends), got {wait!r}")
        self._deadline = None if wait is None else monotonic() + wait

    def next(self) -> float:
        left = MAX_WAIT if self._deadline is None else max(self._deadline - monotonic(), 0.0)
        return min(left, MAX_WAIT)

    def over(self, info: WorkflowInfo) -> bool:
        return info.finished or (self._deadline is not None and monotonic() >= self._deadline)
