"""Hand-offs in every storage (``records.HandOff``, ``tidemq_broker.handoff``): the transaction
that makes messages due (a produce's insert, an ack's release of a step) also leases the ones a
waiting pull takes, under that pull's lease, and says when it has committed."""

from __future__ import annotations

from datetime import datetime
from typing import Optional

import pytest

from tests.conformance.storage_ops import lock, rows, settings
from tidemq import clock
from tidemq_broker.records import LeasedMessage, LockRequest, NewRow, Shard, WorkflowStep
from tidemq_broker.storage import AckItem


@pytest.fixture
def storage(any_storage):
    return any_storage


class Recording:
    """A hand-off that takes, for one pull of ``topic``, every ``take``-th message it is offered
    (1: all of them), and records what the storage did with it."""

    def __init__(self, topic: str, take: int = 1) -> None:
        self.request = LockRequest(Shard(topic), "c-hand", 30, clock.now(), limit=100, lease_token="tok-hand",
                                   broker="b1")
        self.take = take
        self.offered: dict[str, list[tuple[int, int, datetime]]] = {}
        self.asked: list[int] = []
        self.got: Optional[list[LeasedMessage]] = None
        self.begun = self.commits = 0

    def begin(self) -> None:
        self.begun += 1
        self.offered.clear()
        self.got = None

    def takers(self, topic, due):
        self.offered[topic] = list(due)
        if topic != self.request.topic:
            return []
        self.asked = [id for i, (id, _, _) in enumerate(sorted(due)) if i % self.take == 0]
        return [(self.request, self.asked)] if self.asked else []

    def leased(self, request, messages):
        assert request is self.request
        self.got = messages

    def committed(self) -> None:
        self.commits += 1


def test_a_produce_leases_what_the_hand_off_takes_in_its_own_transaction(storage):
    handoff = Recording("t.ho", take=2)
    now = clock.now()
    new = rows("t.ho", 4) + [rows("t.ho.other", 1)[0]]
    ids = storage.messages.insert_messages(new, now, handoff=handoff, broker="b1")
    assert handoff.begun >= 1 and handoff.commits == 1
    # Every new row is offered with its priority and effect time, by topic.
    assert sorted(id for id, _, _ in handoff.offered["t.ho"]) == ids[:4]
    assert [id for id, _, _ in handoff.offered["t.ho.other"]] == [ids[4]]
    assert all(p == 0 and when == row.effect_time for (_, p, when), row in zip(handoff.offered["t.ho"], new))
    taken = handoff.asked
    assert taken == [ids[0], ids[2]]
    assert [m.id for m in handoff.got] == taken
    for m in handoff.got:
        stored = storage.reads.get_message(m.id)
        assert (stored.status, stored.lease_token, stored.consumer) == ("RUNNING", "tok-hand", "c-hand")
        assert (m.status, m.lease_token, m.attempt, m.ttr, m.data) == ("RUNNING", "tok-hand", 1, 30, stored.data)
    # The rest is NEW, and a lock takes it as usual.
    assert sorted(m.id for m in lock(storage, "t.ho")) == [ids[1], ids[3]]


def test_a_produce_hands_off_its_rows_as_stored_in_the_lock_order(storage):
    # The produce leases its own rows without reading them back: each delivery must still be
    # what is stored, and in the lock's order (priority first, then effect time, then id).
    handoff = Recording("t.hof")
    now = clock.now()
    earlier = clock.after(now, -5)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    new = [NewRow("t.hof", '{"a": 1}', now, 3, trace_context=trace),
           NewRow("t.hof", '{"b": "\u00e9"}', earlier, 0, priority=5),
           NewRow("t.hof", "[]", earlier, 7)]
    ids = storage.messages.insert_messages(new, now, handoff=handoff, broker="b1")
    assert [m.id for m in handoff.got] == [ids[1], ids[2], ids[0]]
    for m in handoff.got:
        stored = storage.reads.get_message(m.id)
        assert (m.topic, m.data, m.status, m.effect_time, m.retry_remaining, m.attempt, m.trace_context, m.priority,
                m.ttr, m.lease_token, m.consumer, m.workflow_id, m.depends_on) == \
            ("t.hof", stored.data, stored.status, stored.effect_time, stored.retry_remaining, stored.attempt,
             stored.trace_context, stored.priority, stored.ttr, stored.lease_token, stored.consumer, None, ())


def test_rows_already_stored_under_their_unique_key_are_not_offered(storage):
    now = clock.now()
    [old] = storage.messages.insert_messages([NewRow("t.hk", "1", now, 0, unique_key="k1")], now)
    handoff = Recording("t.hk")
    ids = storage.messages.insert_messages([NewRow("t.hk", "2", now, 0, unique_key="k1"),
                                            NewRow("t.hk", "3", now, 0)], now, handoff=handoff)
    assert ids[0] == old
    assert old not in [id for id, _, _ in handoff.offered.get("t.hk", [])]
    assert storage.reads.get_message(old).status == "NEW"


def test_a_failing_batch_leases_nothing_and_never_says_committed(storage):
    handoff = Recording("t.hbad")
    now = clock.now()
    with pytest.raises(Exception):
        storage.messages.insert_messages([NewRow("t.hbad", "1", now, 0), NewRow("t.hbad", None, now, 0)], now,
                                         handoff=handoff)
    assert handoff.commits == 0
    assert storage.counts.count_by_status("t.hbad") == {}


def test_an_ack_leases_the_step_it_releases_when_the_hand_off_takes_it(storage):
    now = clock.now()
    first, second = storage.dependencies.insert_steps(
        [WorkflowStep(NewRow("t.hstep", '{"a": 1}', now, 0)), WorkflowStep(NewRow("t.hstep", '{"b": 2}', now, 0),
                                                                            after=(0,))], now, broker="b1")
    [delivery] = lock(storage, "t.hstep")
    assert delivery.id == first
    handoff = Recording("t.hstep")
    released: dict = {}
    storage.acks.ack([AckItem(first, delivery.lease_token, True, workflow=True)], clock.now(), "c1", "b1", settings,
                     released, handoff)
    assert handoff.commits == 1
    assert [id for id, _, _ in handoff.offered["t.hstep"]] == [second]
    assert [m.id for m in handoff.got] == [second] and handoff.got[0].depends_on == (first,)
    stored = storage.reads.get_message(second)
    assert (stored.status, stored.lease_token, stored.attempt) == ("RUNNING", "tok-hand", 1)
    # Released, then leased: both lines, in that order, as a release and a lock write them.
    lines = [line.split()[1] for line in stored.trace.splitlines()]
    assert lines[-2:] == ["DEPENDENCY_MET", "LOCKED"]
    assert released == {"t.hstep": {second: 0}}
    assert lock(storage, "t.hstep") == []


def test_a_fan_in_handed_off_by_its_last_parents_ack_names_every_parent(storage):
    """The delivery of a step released and leased by one ack names all its parents: those acked
    before, in other transactions, as well as this ack's; and its siblings still waiting are
    only counted down."""
    now = clock.now()
    a, b, c, child, other = storage.dependencies.insert_steps(
        [WorkflowStep(NewRow("t.hfan", '{"p": %d}' % i, now, 0)) for i in range(3)]
        + [WorkflowStep(NewRow("t.hfan", '{"child": 1}', now, 0), after=(0, 1, 2)),
           WorkflowStep(NewRow("t.hfan", '{"other": 1}', now, 0), after=(2,))], now, broker="b1")
    leased = {m.id: m for m in lock(storage, "t.hfan")}
    assert sorted(leased) == [a, b, c]
    storage.acks.ack([AckItem(id, leased[id].lease_token, True, workflow=True) for id in (a, c)], clock.now(),
                     "c1", "b1", settings, {}, Recording("t.none"))
    assert storage.reads.get_message(child).status == "WAITING"
    handoff = Recording("t.hfan")
    storage.acks.ack([AckItem(b, leased[b].lease_token, True, workflow=True)], clock.now(), "c1", "b1", settings,
                     {}, handoff)
    got = {m.id: m.depends_on for m in handoff.got or ()}
    assert got == {child: (a, b, c)}
    assert lock(storage, "t.hfan")[0].depends_on == (c,)  # released by the first ack, locked now: ``other``
    assert storage.reads.get_message(other).status == "RUNNING"


def test_an_ack_that_releases_nothing_offers_nothing(storage):
    now = clock.now()
    storage.messages.insert_messages(rows("t.hplain", 1), now)
    [delivery] = lock(storage, "t.hplain")
    handoff = Recording("t.hplain")
    storage.acks.ack([AckItem(delivery.id, delivery.lease_token, True, workflow=True)], clock.now(), "c1", "b1",
                     settings, {}, handoff)
    assert not any(handoff.offered.values()) and handoff.got is None


def test_an_ack_releases_the_steps_no_pull_takes_and_leaves_them_new(storage):
    now = clock.now()
    first, second, third = storage.dependencies.insert_steps(
        [WorkflowStep(NewRow("t.hrest", '{"a": 1}', now, 0)),
         WorkflowStep(NewRow("t.hrest", '{"b": 2}', now, 0), after=(0,)),
         WorkflowStep(NewRow("t.hrest.other", '{"c": 3}', now, 0), after=(0,))], now, broker="b1")
    [delivery] = lock(storage, "t.hrest")
    handoff = Recording("t.hrest")
    storage.acks.ack([AckItem(first, delivery.lease_token, True, workflow=True)], clock.now(), "c1", "b1", settings,
                     {}, handoff)
    assert [m.id for m in handoff.got] == [second]
    other = storage.reads.get_message(third)
    assert other.status == "NEW" and other.trace.splitlines()[-1].split()[1] == "DEPENDENCY_MET"
    assert [m.id for m in lock(storage, "t.hrest.other")] == [third]
