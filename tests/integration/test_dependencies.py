"""Dependencies between messages against real MariaDB and ZooKeeper and two real brokers: a step
produced with ``depends_on`` through one broker is released by an ack through the other, a
fan-in whose last members are acked at the same instant through different brokers runs once,
a failed dependency cancels its step, an unknown id is refused with nothing stored, and a
workflow submitted whole runs in its order (a cycle is refused)."""

from __future__ import annotations

import asyncio

import pytest

from tidemq import BatchConsumer, Client, Settings, Workflow, chain, chord, group, sig, trace
from tidemq.aio import AsyncClient
from tidemq.errors import DependencyCycleError, UnknownDependencyError
from tidemq.workflows import Step

from tests.background import InThread
from tests.integration.conftest import ack_at_once
from tests.servers import wait_until


def _met(broker, msg_id):
    return [e for e in trace.parse(broker.storage.reads.get_message(msg_id).trace) if e["event"] == "DEPENDENCY_MET"]


def test_a_step_produced_through_one_broker_is_released_by_an_ack_through_the_other(two_brokers, clients):
    a, b = clients
    parent = a.produce("deps.parent", {"n": 1}, result=True)
    child = b.produce("deps.child", {"n": 2}, depends_on=[parent], result=True)
    assert child.status() == "WAITING"
    children = BatchConsumer("deps.child", ttr=30, client=b)
    assert children.pull(max_messages=10, wait=0) == []
    parents = BatchConsumer("deps.parent", ttr=30, client=a)
    [got] = parents.pull(max_messages=10, wait=10)
    assert got.id == parent.id
    parents.ack(succeeded=[got.id], results={got.id: "done"})
    [released] = children.pull(max_messages=10, wait=10)
    assert released.id == child.id and [e["dependency"] for e in _met(two_brokers[0], child.id)] == [str(parent.id)]
    children.ack(succeeded=[released.id])
    assert child.result(timeout=10) is None and parent.result(timeout=10) == "done"


def test_a_fan_in_whose_last_members_finish_at_once_on_two_brokers_runs_once(two_brokers, clients):
    a, b = clients
    members = a.produce_many("deps.member", [{"n": n} for n in range(6)])
    join = b.produce("deps.join", {"all": True}, depends_on=members)
    on_a, on_b = (BatchConsumer("deps.member", ttr=30, client=client) for client in (a, b))
    held_a = on_a.pull(max_messages=5, wait=10)
    held_b = on_b.pull(max_messages=5, wait=10)
    assert sorted(m.id for m in held_a + held_b) == sorted(members) and len(held_b) == 1
    on_a.ack(succeeded=[m.id for m in held_a[:4]])
    assert two_brokers[0].storage.reads.get_message(join).deps_left == 2
    # The last two, one through each broker, at the same instant.
    ack_at_once((on_a, held_a[4]), (on_b, held_b[0]))
    stored = two_brokers[0].storage.reads.get_message(join)
    assert (stored.status, stored.deps_left, len(_met(two_brokers[0], join))) == ("NEW", 0, 1)
    joins = BatchConsumer("deps.join", ttr=30, client=a)
    assert [m.id for m in joins.pull(max_messages=10, wait=10)] == [join]
    assert joins.pull(max_messages=10, wait=0) == []


def test_a_failed_dependency_cancels_its_step_and_an_unknown_one_is_refused(two_brokers, clients):
    a, b = clients
    parent = a.produce("deps.fails", {"n": 1}, retry=0)
    child = b.produce("deps.after", {"n": 2}, depends_on=[parent], result=True)
    parents = BatchConsumer("deps.fails", ttr=30, client=a)
    [got] = parents.pull(max_messages=10, wait=10)
    parents.ack(failed={got.id: "boom"})
    assert child.status() == "CANCELLED"
    with pytest.raises(UnknownDependencyError, match=str(10 ** 12)):
        b.produce("deps.after", {"n": 3}, depends_on=[parent, 10 ** 12])
    assert two_brokers[1].storage.counts.count_by_status("deps.after") == {"deps.after": {"CANCELLED": 1}}


def test_a_workflow_submitted_whole_through_one_broker_runs_in_order_through_the_other(two_brokers, clients):
    a, b = clients
    wf = Workflow()
    fetch = wf.add("flow.fetch", {"url": "u"})
    parts = [wf.add("flow.part", {"n": n}, after=[fetch]) for n in range(2)]
    wf.add("flow.merge", {"all": True}, after=parts)
    fetch_id, *part_ids, merge_id = a.submit(wf)
    ran = []
    for topic, expected in (("flow.fetch", [fetch_id]), ("flow.part", part_ids), ("flow.merge", [merge_id])):
        consumer = BatchConsumer(topic, ttr=30, client=b)
        got = consumer.pull(max_messages=10, wait=10)
        assert sorted(m.id for m in got) == sorted(expected)
        consumer.ack(succeeded=[m.id for m in got])
        ran += sorted(m.id for m in got)
    assert ran == [fetch_id, *sorted(part_ids), merge_id]
    *members, body = chord(group(sig("flow.img", {"n": n}) for n in range(3)), sig("flow.zip")).produce(b)
    assert [two_brokers[0].storage.reads.get_message(i).status for i in (*members, body)] == ["NEW"] * 3 + ["WAITING"]
    with pytest.raises(DependencyCycleError):
        cycle = Workflow()
        cycle.add("flow.cycle", after=[Step(cycle, 1)])
        cycle.add("flow.cycle", after=[Step(cycle, 0)])
        a.submit(cycle)
    assert two_brokers[0].storage.counts.count_by_status("flow.cycle") == {}


def test_the_asyncio_client_produces_with_dependencies_and_submits_a_workflow(two_brokers, settings):
    async def run():
        client = AsyncClient(Settings.from_env({}, brokers=two_brokers[0].address, zk_hosts=settings.zk_hosts))
        try:
            parent = await client.produce("aio.parent", {"n": 1}, result=True)
            child = await client.produce_many("aio.child", [1, 2], depends_on=[parent])
            ids = await client.submit(chain(sig("aio.first"), sig("aio.second")).workflow())
            return parent.id, child, ids
        finally:
            await client.close()

    parent, children, (first, second) = asyncio.run(run())
    reads = two_brokers[0].storage.reads
    assert [reads.get_message(i).status for i in (parent, *children, first, second)] == \
        ["NEW", "WAITING", "WAITING", "NEW", "WAITING"]


INPUTS = "tests.integration.handlers_inputs"


def test_workers_hand_each_result_of_a_chain_on_and_a_chord_callback_gets_its_members_results(
        settings, two_brokers, clients, spawn):
    from tests.processes import process_env, start_worker, wait_registered

    a, b = clients
    start_worker(spawn, "inputs", INPUTS, process_env(settings))
    for topic in ("inputs.step", "inputs.member", "inputs.callback", "inputs.async_callback"):
        wait_registered(a.coordinator, topic, 1)
    # Each step returns its input + 1: the last of a chain of three started at 1 returns 3.
    steps = chain(sig("inputs.step", 1), sig("inputs.step"), sig("inputs.step")).produce(a)
    assert b.handle(steps[-1]).result(timeout=60) == 3
    assert [b.handle(i).result(timeout=10) for i in steps] == [1, 2, 3]
    # A chord's callback (threaded, and async) gets the members' results in the members' order.
    members = [sig("inputs.member", n) for n in range(6)]
    ids = chord(group(*members), sig("inputs.callback")).produce(b)
    assert a.handle(ids[-1]).result(timeout=60) == {"inputs": [0, 10, 20, 30, 40, 50], "statuses": ["SUCCESS"] * 6}
    ids = chord(group(*reversed(members)), sig("inputs.async_callback")).produce(a)
    assert b.handle(ids[-1]).result(timeout=60) == {"inputs": [50, 40, 30, 20, 10, 0], "depends_on": ids[:-1]}


def test_a_steps_inputs_are_read_from_the_broker_that_leased_it(settings, two_brokers):
    from tidemq.link import AckItem
    from tidemq.queue_runner import delivery_to_message

    addresses = [broker.address for broker in two_brokers]
    both = Client(Settings.from_env({}, brokers=",".join(addresses), zk_hosts=settings.zk_hosts))
    try:
        parents = both.produce_many("inputs.pinned.parent", [1, 2])
        step = both.produce("inputs.pinned", None, depends_on=parents)
        got = both.pull("inputs.pinned.parent", "c1", max_messages=2, wait=10)
        both.ack("inputs.pinned.parent", "c1", [AckItem(d.id, d.lease_token, True, result=str(d.id * 2)) for d in got])
        [leased] = both.pull("inputs.pinned", "c1", wait=10)
        assert (leased.id, leased.depends_on) == (step, tuple(parents)) and leased.broker in addresses
        asked = []
        call = both.pool.call
        both.pool.call = lambda method, *args, **kw: (asked.append((method, kw.get("prefer")))
                                                      or call(method, *args, **kw))
        assert delivery_to_message(leased, both).inputs == [parents[0] * 2, parents[1] * 2]
        assert asked == [("Results", leased.broker)]
    finally:
        both.close()


def test_a_step_released_through_one_broker_wakes_a_pull_waiting_on_the_other(two_brokers, clients):
    """The releasing broker signals the topic through ZooKeeper; without the signal, the waiting
    broker would find the step only by its earliest-due probe or its pull's recheck, both turned
    off here, so the pull would end empty at its deadline."""
    a, b = clients
    hub = two_brokers[1].hub
    hub._earliest_every, hub.recheck = 10**9, 600.0
    parent = a.produce("deps.wake.parent", {"n": 1})
    child = b.produce("deps.wake.child", {"n": 2}, depends_on=[parent])
    children = BatchConsumer("deps.wake.child", ttr=30, client=b)
    assert children.pull(max_messages=1, wait=0) == []  # broker b now watches the topic's signal
    waiting = InThread(lambda: children.pull(max_messages=1, wait=60))
    wait_until(lambda: hub.waiting("deps.wake.child") == 1, 10, what="the pull waiting on broker b")
    parents = BatchConsumer("deps.wake.parent", ttr=30, client=a)
    [got] = parents.pull(max_messages=1, wait=10)
    parents.ack(succeeded=[got.id])
    [released] = waiting.value(50)  # well before the pull's 60 s deadline
    assert released.id == child
