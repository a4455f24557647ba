"""``workflow_open_step`` on every storage: the highest id of a workflow's messages not ended
yet (what a wait for the workflow's end sleeps on), None once all ended or for no workflow."""

from __future__ import annotations

from tests.conformance.storage_ops import ack, insert, lock, rows
from tidemq import clock
from tidemq_broker.storage import AckItem, WorkflowStep


def test_the_open_step_is_the_highest_not_ended_and_none_at_the_end(any_storage):
    storage = any_storage
    [outside] = insert(storage, "t.open.outside", 1)
    made = rows("t.open", 3)
    steps = [WorkflowStep(made[0], (outside,), ()), WorkflowStep(made[1], (), ()), WorkflowStep(made[2], (), (0, 1))]
    first, second, tail = storage.dependencies.insert_steps(steps, clock.now(), broker="b1")
    assert storage.dependencies.workflow_open_step(first) == tail  # WAITING counts as open
    assert storage.dependencies.workflow_open_step(tail + 10 ** 9) is None
    assert storage.dependencies.workflow_open_step(outside) is None  # a message, not a workflow
    [leased] = lock(storage, "t.open.outside")
    ack(storage, [AckItem(leased.id, leased.lease_token, True)])
    leases = {m.id: m for m in lock(storage, "t.open", limit=2)}
    assert set(leases) == {first, second}
    assert storage.dependencies.workflow_open_step(first) == tail  # RUNNING ones below it
    ack(storage, [AckItem(i, leases[i].lease_token, True) for i in (first, second)])
    [last] = lock(storage, "t.open")
    assert last.id == tail and storage.dependencies.workflow_open_step(first) == tail
    ack(storage, [AckItem(tail, last.lease_token, True)])
    assert storage.dependencies.workflow_open_step(first) is None
    assert storage.dependencies.workflow(first).state == "SUCCEEDED"
