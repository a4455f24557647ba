"""The StubBroker's workflows: the row the broker keeps of each submission of steps, read and
waited on (``workflow_state``), handles on them, and cancelling one whole, as the broker's
storages do it (``tidemq_broker.storages.workflows``): the workflow's id is its first step's;
a stored message it waits on that belongs to no workflow yet joins it; it ends with its last
step, FAILED when a step ended FAIL or CANCELLED (or was removed), CANCELLED when cancelled
whole (at once; it ends when its marked RUNNING steps stopped). Its counts are fixed when it
ends. The stub runs every workflow under the policy stop; it reports the policy the broker
would record."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional, Sequence

from . import lifecycle
from .dependencies import FailurePolicy, WaitMode, WorkflowState
from .errors import MessageNotFoundError
from .lifecycle import Change, MessageStatus
from .limits import MAX_WAIT
from .rpc_build import workflow_id
from .tables import MESSAGE as M
from .workflow_handles import WorkflowHandle
from .workflow_info import Waiting, WorkflowInfo

__all__ = ["StubWorkflows", "policy_of"]

_OPEN = {MessageStatus.NEW.value, MessageStatus.WAITING.value, MessageStatus.RUNNING.value}
_PENDING = {MessageStatus.NEW.value, MessageStatus.WAITING.value}
_FAILED = {MessageStatus.FAIL.value, MessageStatus.CANCELLED.value}


def policy_of(wait_modes: Sequence[int]) -> str:
    """The policy the broker records for steps waiting as ``wait_modes`` (``workflow_tally.policy_of``)."""
    return (FailurePolicy.CONTINUE if set(wait_modes) - {WaitMode.AFTER_SUCCESS} else FailurePolicy.STOP).value


@dataclass
class _Workflow:
    policy: str
    members: tuple[int, ...]
    created_at: datetime
    cancelled: bool = False
    ended: Optional[WorkflowInfo] = None


class StubWorkflows:
    """Mixed into :class:`tidemq.stub.StubBroker`, which provides the state these calls use."""

    _cond: threading.Condition
    _rows: dict[int, dict[str, Any]]

    def _now(self) -> datetime: ...  # provided by StubBroker
    def _apply(self, row: dict[str, Any], change: Change, lease_token: Optional[str] = None) -> bool: ...
    def _cancel_running(self, ids: Sequence[int]) -> tuple[list[bool], set[str]]: ...
    def _signal_cancels(self, topics: set[str]) -> None: ...

    def _init_workflows(self) -> None:
        self._workflows: dict[int, _Workflow] = {}
        self._workflow_of: dict[int, int] = {}  # message id -> its workflow's id

    def workflow_state(self, workflow: Any, wait: Optional[float] = 0.0,
                       timeout: Optional[float] = None) -> WorkflowInfo:
        """As :meth:`tidemq.Client.workflow_state`."""
        id, waiting = workflow_id(workflow), Waiting(wait)
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while True:
                info = self._workflow_info(id)
                if waiting.over(info):
                    return info
                self._cond.wait(MAX_WAIT if deadline is None else max(deadline - time.monotonic(), 0.0))

    def workflow_handle(self, workflow: Any) -> WorkflowHandle:
        """As :meth:`tidemq.Client.workflow_handle`."""
        return WorkflowHandle(workflow_id(workflow), self)

    def cancel_workflow(self, workflow: Any, timeout: Optional[float] = None, *, running: bool = False) -> int:
        """As :meth:`tidemq.Client.cancel_workflow`: its NEW and WAITING steps removed (what
        waits on them elsewhere is stopped), with ``running`` its RUNNING ones marked; how many."""
        id = workflow_id(workflow)
        with self._cond:
            found = self._workflows.get(id)
            if found is None:
                return 0
            # Those that come last first: a removed step's children are gone already, not stopped.
            pending = sorted((m for m in found.members if m in self._rows and self._rows[m][M.status] in _PENDING),
                             reverse=True)
            removed = sum(m in self._rows and self._apply(self._rows[m], lifecycle.cancel()) for m in pending)
            held = [m for m in found.members if m in self._rows and self._rows[m][M.status] == _RUNNING
                    and not self._rows[m][M.cancel_requested]] if running else []
            marks, topics = self._cancel_running(held)
            if found.ended is None:
                found.cancelled = True
                self._workflow_step_ended(id)
            self._cond.notify_all()
        self._signal_cancels(topics)
        return removed + sum(marks)

    # -- internals (called with the lock held) -----------------------------------------------
    def _new_workflow(self, ids: Sequence[int], waited: Sequence[int], policy: str, now: datetime) -> None:
        joined = [p for p in waited if p not in self._workflow_of and p in self._rows
                  and self._rows[p][M.status] in _OPEN]
        members = (*ids, *joined)
        for member in members:
            self._workflow_of[member] = ids[0]
        self._workflows[ids[0]] = _Workflow(policy, members, now)
        self._workflow_step_ended(ids[0])  # steps stopped at once may have ended it

    def _workflow_step_ended(self, msg_id: int) -> None:
        """After a change to message ``msg_id``: end its workflow if no step of it is left."""
        found = self._workflows.get(self._workflow_of.get(msg_id, 0))
        if found is not None and found.ended is None:
            info = self._live_info(self._workflow_of[msg_id], found, None)
            if info.steps_left == 0:
                state = WorkflowState.CANCELLED if found.cancelled else \
                    WorkflowState.FAILED if info.steps_failed else WorkflowState.SUCCEEDED
                found.ended = self._live_info(self._workflow_of[msg_id], found, self._now(), state)

    def _workflow_info(self, id: int) -> WorkflowInfo:
        found = self._workflows.get(id)
        if found is None:
            raise MessageNotFoundError(f"workflow {id} is not stored: no submission's first step has that id")
        return found.ended or self._live_info(id, found, None)

    def _live_info(self, id: int, found: _Workflow, finished_at: Optional[datetime],
                   state: Optional[WorkflowState] = None) -> WorkflowInfo:
        statuses = [self._rows[m][M.status] if m in self._rows else MessageStatus.CANCELLED.value
                    for m in found.members]
        left = sum(status in _OPEN for status in statuses)
        failed = sum(status in _FAILED for status in statuses)
        if state is None:
            state = WorkflowState.CANCELLED if found.cancelled else WorkflowState.RUNNING
        return WorkflowInfo(id, FailurePolicy(found.policy), state, len(found.members), left, failed,
                            found.created_at, finished_at)


_RUNNING = MessageStatus.RUNNING.value
