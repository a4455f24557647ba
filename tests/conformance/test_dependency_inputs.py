"""What a leased step of a workflow says about its dependencies, on every storage: the ids of
the messages it waited on (what its handler's ``message.inputs`` reads the results of), read
only for leases with workflow rows."""

from __future__ import annotations

import pytest

from tests.conformance.storage_ops import ack, insert, lock
from tests.conformance.test_dependencies import _steps, _submit, _succeed
from tidemq import clock
from tidemq_broker.storage import AckItem, AckOutcome, LockRequest, Shard


@pytest.fixture
def storage(any_storage):
    return any_storage


def test_a_leased_step_names_the_messages_it_waited_on_and_a_plain_message_none(storage):
    [plain] = insert(storage, "t.parents", 1)
    # Members of a fan-in (one added after the callback's other parents) and a stored message
    # the callback also waits on, which has already succeeded: every one is named, ascending.
    [stored] = insert(storage, "t.parents.done", 1)
    _succeed(storage, "t.parents.done", [stored])
    ids = _submit(storage, _steps("t.parents", (), (), (), (2, 0, 1), depends_on={3: [stored]}))
    members, callback = ids[:3], ids[3]
    batch = {m.id: m for m in lock(storage, "t.parents")}
    assert sorted(batch) == sorted([plain, *members])
    assert batch[plain].depends_on == ()
    assert {batch[m].depends_on for m in members} == {()}  # steps that waited on nothing
    assert ack(storage, [AckItem(m, batch[m].lease_token, True) for m in members]) == [AckOutcome.APPLIED] * 3
    [step] = lock(storage, "t.parents")
    assert step.id == callback
    assert step.depends_on == tuple(sorted([stored, *members]))


def test_a_serial_lease_of_a_step_names_its_parents_too(storage):
    [parent] = insert(storage, "t.serial.parent", 1)
    [step] = _submit(storage, _steps("t.serial", (), depends_on={0: [parent]}))
    _succeed(storage, "t.serial.parent", [parent])
    [leased] = storage.leases.lock_serial(LockRequest(Shard("t.serial"), "c1", 30, clock.now()))
    assert (leased.id, leased.depends_on) == (step, (parent,))
    # A workflow's first step waited on nothing: it is a workflow row with no parents.
    [first, _] = _submit(storage, _steps("t.serial", (), (0,)))
    ack(storage, [AckItem(leased.id, leased.lease_token, True)])
    [head] = storage.leases.lock_serial(LockRequest(Shard("t.serial"), "c1", 30, clock.now()))
    assert (head.id, head.depends_on) == (first, ())


def test_only_a_lease_with_workflow_rows_reads_the_edges_once(storage):
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    statements: list[str] = []

    def listener(conn, cursor, statement, *args):
        statements.append(statement)

    [parent] = insert(storage, "t.edges.parent", 1)
    steps = _submit(storage, _steps("t.edges", (), (), depends_on={0: [parent], 1: [parent]}))
    insert(storage, "t.edges.plain", 5)
    _succeed(storage, "t.edges.parent", [parent])
    event.listen(Engine, "before_cursor_execute", listener)
    try:
        plain = lock(storage, "t.edges.plain")
        plain_statements, statements[:] = list(statements), []
        leased = lock(storage, "t.edges")
    finally:
        event.remove(Engine, "before_cursor_execute", listener)
    assert len(plain) == 5 and {m.depends_on for m in plain} == {()}
    assert sorted(m.id for m in leased) == sorted(steps) and {m.depends_on for m in leased} == {(parent,)}
    assert not [s for s in plain_statements if "tidemq_dependency" in s]
    if plain_statements:  # a SQL storage: one read of the edges for the two steps
        assert len([s for s in statements if "tidemq_dependency" in s]) == 1


def test_a_leased_step_names_its_workflow_and_a_plain_message_none(storage):
    [plain] = insert(storage, "t.wf.id", 1)
    first, second = _submit(storage, _steps("t.wf.id", (), (0,)))
    batch = {m.id: m for m in lock(storage, "t.wf.id")}
    assert sorted(batch) == sorted([plain, first])
    assert (batch[plain].workflow_id, batch[first].workflow_id) == (None, first)


@pytest.mark.parametrize("marked", ["right", "wrong", "none"])
def test_an_ack_mixing_steps_and_plain_messages_releases_the_steps_dependents_however_marked(storage, marked):
    # ``AckItem.workflow`` only routes an item (a step straight to the exact path): a mark on a
    # plain message, or none on a step, must give the same outcomes and release the same steps.
    plain = insert(storage, "t.wf.mark", 2)
    first, second = _submit(storage, _steps("t.wf.mark", (), (0,)))
    batch = {m.id: m for m in lock(storage, "t.wf.mark")}
    assert sorted(batch) == sorted([*plain, first])

    def mark(msg_id: int) -> bool:
        step = batch[msg_id].workflow_id is not None
        return {"right": step, "wrong": not step, "none": False}[marked]

    items = [AckItem(i, batch[i].lease_token, True, workflow=mark(i)) for i in sorted(batch)]
    stale = AckItem(plain[0], "not-its-token", True, workflow=mark(plain[0]))
    assert ack(storage, [stale]) == [AckOutcome.STALE]
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3  # a repeated ack (a lost reply) changes nothing
    [released] = lock(storage, "t.wf.mark")
    assert (released.id, released.depends_on, released.workflow_id) == (second, (first,), first)
    assert storage.dependencies.workflow(first).steps_left == 1
