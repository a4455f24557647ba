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


@pytest.mark.parametrize("marked", ["right", "right-id", "wrong-id", "wrong", "none"])
def test_an_ack_mixing_steps_and_plain_messages_releases_the_steps_dependents_however_marked(storage, marked):
    # ``AckItem.workflow`` and ``workflow_id`` only route an item (a step straight to the exact
    # path, or with its workflow's id to an UPDATE guarded by it): a mark on a plain message, none
    # on a step, or a wrong workflow id must give the same outcomes and release the same steps.
    plain = insert(storage, "t.wf.mark", 2)
    first, second = _submit(storage, _steps("t.wf.mark", (), (0,)))
    batch = {m.id: m for m in lock(storage, "t.wf.mark")}
    assert sorted(batch) == sorted([*plain, first])

    def mark(msg_id: int) -> bool:
        step = batch[msg_id].workflow_id is not None
        return {"right": step, "right-id": step, "wrong-id": True, "wrong": not step, "none": False}[marked]

    def workflow_id(msg_id: int):
        if marked == "right-id":
            return batch[msg_id].workflow_id
        return first + 1000 if marked == "wrong-id" else None

    items = [AckItem(i, batch[i].lease_token, True, workflow=mark(i), workflow_id=workflow_id(i))
             for i in sorted(batch)]
    stale = AckItem(plain[0], "not-its-token", True, workflow=mark(plain[0]), workflow_id=workflow_id(plain[0]))
    assert ack(storage, [stale]) == [AckOutcome.STALE]
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3  # a repeated ack (a lost reply) changes nothing
    [released] = lock(storage, "t.wf.mark")
    assert (released.id, released.depends_on, released.workflow_id) == (second, (first,), first)
    assert storage.dependencies.workflow(first).steps_left == 1


def test_a_step_names_every_parent_even_when_the_server_cuts_their_list_short(storage):
    # A SQL storage reads each step's parents as one comma-separated list; a MySQL server whose
    # group_concat_max_len is lower than the storage asks for cuts it short. The step must still
    # name every parent (read again edge by edge), and an ack of members must count each one.
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    cut: list[str] = []
    dialects: set[str] = set()

    def shorten(conn, cursor, statement, *args):
        dialects.add(conn.dialect.name)
        if "group_concat" in statement.lower() and conn.dialect.name == "mysql":
            conn.connection.cursor().execute("SET SESSION group_concat_max_len = 8")  # "123,124," at most
            cut.append(statement)

    def restore(conn, cursor, statement, *args):
        if "group_concat" in statement.lower() and conn.dialect.name == "mysql":
            conn.connection.cursor().execute("SET SESSION group_concat_max_len = 1048576")

    ids = _submit(storage, _steps("t.cut", *[()] * 12, tuple(range(12))))
    members, callback = ids[:12], ids[12]
    batch = lock(storage, "t.cut")
    assert sorted(m.id for m in batch) == members
    assert ack(storage, [AckItem(m.id, m.lease_token, True, workflow=True)
                         for m in batch[:5]]) == [AckOutcome.APPLIED] * 5
    assert lock(storage, "t.cut") == []  # 7 members left
    assert ack(storage, [AckItem(m.id, m.lease_token, True, workflow=True)
                         for m in batch[5:]]) == [AckOutcome.APPLIED] * 7
    event.listen(Engine, "before_cursor_execute", shorten)
    event.listen(Engine, "after_cursor_execute", restore)
    try:
        [step] = lock(storage, "t.cut")
    finally:
        event.remove(Engine, "before_cursor_execute", shorten)
        event.remove(Engine, "after_cursor_execute", restore)
    assert (step.id, step.depends_on) == (callback, tuple(members))
    assert bool(cut) == ("mysql" in dialects)  # the fallback was taken where a list can be cut


@pytest.mark.parametrize("results", [False, True])
def test_steps_acked_with_their_workflow_id_skip_the_locking_read_and_release_their_dependents(storage, results):
    import json

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    statements: list[str] = []

    def listener(conn, cursor, statement, *args):
        statements.append(statement)

    ids = _submit(storage, _steps("t.known", (), (), (), (0, 1, 2)))
    members, callback = ids[:3], ids[3]
    batch = {m.id: m for m in lock(storage, "t.known")}
    assert sorted(batch) == members
    items = [AckItem(i, batch[i].lease_token, True, result=json.dumps({"n": i}) if results else None, workflow=True,
                     workflow_id=batch[i].workflow_id) for i in members]
    event.listen(Engine, "before_cursor_execute", listener)
    try:
        assert ack(storage, items[:2]) == [AckOutcome.APPLIED] * 2
        assert lock(storage, "t.known") == []  # one member left
        assert ack(storage, items[2:]) == [AckOutcome.APPLIED]
    finally:
        event.remove(Engine, "before_cursor_execute", listener)
    assert ack(storage, items) == [AckOutcome.APPLIED] * 3  # a repeat (a lost reply): the exact path says so
    locking = [s for s in statements if "lease_token" in s.split("FROM")[0] and "FOR UPDATE" in s]
    assert not locking, locking  # no read of the acked rows before their UPDATE
    [step] = lock(storage, "t.known")
    assert (step.id, step.depends_on) == (callback, tuple(members))
    stored = {r.id: r for r in storage.reads.get_results(members)}
    assert {r.status for r in stored.values()} == {"SUCCESS"}
    assert [stored[i].result for i in members] == ([json.dumps({"n": i}) for i in members] if results else [None] * 3)
    assert storage.dependencies.workflow(members[0]).steps_left == 1
