"""A Workflow call's wait for a workflow's end, on the result waiters (``results.ResultHub``).

A workflow has ended once no step of it is left (``finished_at`` is set): a workflow cancelled
whole is CANCELLED at once, but its marked RUNNING steps may still run, and a waiter that goes
on to clean up after it must not start before they stop.

A workflow ends in the transaction of its last step's end, so it cannot end before any step it
still has open. The wait therefore sleeps on one open step at a time, the highest id (a chain's
tail or a chord's callback: the step that ends last, so one sleep is usually enough), as a
Results call sleeps on a message: woken at once by this broker's ack, cancel or expiry of it,
and within a probe interval when another broker ends it or a stop policy removes it. Then the
workflow's row is read again: still open (a group's members end in any order), the next open
step is waited on. Nothing polls the workflow row, and nothing new runs while nobody waits.
"""

from __future__ import annotations

import time
from typing import Optional

from .records import WorkflowRecord
from .results import ResultHub, is_final
from .storage import Storage

__all__ = ["wait_workflow"]


def wait_workflow(storage: Storage, results: ResultHub, workflow_id: int, deadline: float) -> Optional[WorkflowRecord]:
    """The row of workflow ``workflow_id`` once it ended, or at ``deadline`` (a
    ``time.monotonic()`` value); None for an unknown workflow."""
    while True:
        record = storage.dependencies.workflow(workflow_id)
        if record is None or record.finished_at is not None or time.monotonic() >= deadline:
            return record
        step = storage.dependencies.workflow_open_step(workflow_id)
        if step is None:  # its last step ended between the two reads: the row says so now
            return storage.dependencies.workflow(workflow_id)
        found = results.wait([step], deadline, storage.reads.get_results)
        if not is_final([step], found):  # the deadline, or the broker stopping
            return storage.dependencies.workflow(workflow_id)
