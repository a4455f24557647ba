"""A workflow's row as its steps end, shared by the SQL and the memory storage (no SQL here).

Each transaction that ends steps of workflows (an ack, a lease expiry, a cancel, a delete, a
dependency's failure or a submission's stops) tallies them per workflow with :class:`Tally`
and, as its last statement, lowers each workflow's ``steps_left`` under the workflow row's
lock. Only the transaction that brings it to 0 finds the row unfinished with nothing left, and
sets its state (:func:`final_state`) and ``finished_at``: the row lock orders two such
transactions on two brokers, so the second finds the row finished. :class:`Outcomes` tells a
broker, after the commit, which workflows its transactions ended (its metrics count them).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Iterable, Mapping, Optional

from tidemq.dependencies import FailurePolicy, WaitMode, WorkflowState
from tidemq.lifecycle import SUCCESS

from ..records import WorkflowStep

__all__ = ["Tally", "Outcomes", "final_state", "policy_of"]


class Tally:
    """Steps of workflows ended in one transaction: per workflow id, [ended, failed]."""

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}
        #: Workflows a step of which this transaction made due: none of them can end in it.
        self.open: set[int] = set()

    def opened(self, workflow_id: int) -> None:
        """A step of ``workflow_id`` was released in this transaction: it is still to run, so
        the workflow keeps a step left whatever this transaction ends (``settle`` need not read
        its row to know it did not end)."""
        self.open.add(workflow_id)

    def end(self, workflow_id: int, status: str, failed: Optional[bool] = None) -> None:
        """One step of ``workflow_id`` ended ``status`` (failed unless SUCCESS, or as ``failed`` says)."""
        counts = self.counts.setdefault(workflow_id, [0, 0])
        counts[0] += 1
        counts[1] += int(status != SUCCESS.value if failed is None else failed)

    def add(self, workflow_id: int, ended: int, failed: int) -> None:
        """``ended`` steps of ``workflow_id`` ended, ``failed`` of them FAIL or CANCELLED."""
        counts = self.counts.setdefault(workflow_id, [0, 0])
        counts[0] += ended
        counts[1] += failed

    def end_many(self, ended: Iterable[tuple[int, str]]) -> None:
        """Each (workflow id, status) of ``ended``, as :meth:`end`."""
        for workflow_id, status in ended:
            self.end(workflow_id, status)

    def __bool__(self) -> bool:
        return bool(self.counts)


def final_state(state: str, steps_failed: int) -> str:
    """The state a workflow ends in once no step is left: CANCELLED if it was cancelled as a
    whole, FAILED if a step ended FAIL or CANCELLED, else SUCCEEDED."""
    if state == WorkflowState.CANCELLED.value:
        return state
    return (WorkflowState.FAILED if steps_failed else WorkflowState.SUCCEEDED).value


def policy_of(steps: Iterable[WorkflowStep]) -> str:
    """The failure policy a submission records: continue when a step waits other than after
    its dependencies' success, else stop."""
    waits = {step.wait_mode for step in steps}
    return (FailurePolicy.CONTINUE if waits - {WaitMode.AFTER_SUCCESS} else FailurePolicy.STOP).value


class Outcomes:
    """Who wants to know, after the commit, which workflows a storage's transactions ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Mapping[str, int]], None]] = []

    def watch(self, listener: Callable[[Mapping[str, int]], None]) -> None:
        """Call ``listener`` with {state: count} after each commit that ended workflows."""
        with self._lock:
            self._listeners.append(listener)

    def ended(self, finished: Mapping[int, str]) -> None:
        """Tell the listeners of ``finished`` ({workflow id: state}), committed."""
        if not finished:
            return
        by_state = Counter(finished.values())
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(dict(by_state))
