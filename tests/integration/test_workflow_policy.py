"""Failure policies, batches and cancelling a workflow with real workers on two brokers over
MariaDB and ZooKeeper: a batch's callbacks run (or are cancelled) by its members' outcomes, a
chain under the policy continue runs past a failure, a workflow's row ends in the right state
and the broker that ended it counts it, and a workflow cancelled whole runs nothing more."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import REGISTRY

from tests.integration.conftest import ack_at_once
from tests.servers import wait_until
from tidemq import Message, MessageType, Worker, batch, chain, sig
from tidemq.consumer import ConsumerSpec


@pytest.fixture
def workers():
    started = []

    def start(client, topic, handler, ttr=30):
        spec = ConsumerSpec(topic, MessageType.QUEUE, handler, threads=4, ttr=ttr, batch=8)
        started.append(Worker([spec], client=client, drain_timeout=5).start())
        wait_until(lambda: client.coordinator.consumers(topic), 10, what="consumer registration")

    yield start
    for worker in started:
        worker.stop()


def _finished(state):
    return REGISTRY.get_sample_value("tidemq_workflows_finished_total", {"state": state}) or 0.0


def test_a_batch_runs_its_callbacks_by_its_members_outcomes(two_brokers, clients, workers):
    ran, lock = {}, threading.Lock()

    def record(message: Message) -> None:
        with lock:
            ran.setdefault(message.topic, []).append(message.id)

    def member(message: Message) -> None:
        record(message)
        if message.data["n"] in (3, 7):
            raise RuntimeError("this member fails")

    for client in clients:  # members and callbacks run on workers of both brokers
        workers(client, "wfp.member", member)
        for topic in ("wfp.complete", "wfp.success", "wfp.failure"):
            workers(client, topic, record)
    failed_before = _finished("FAILED")
    ids = batch([sig("wfp.member", {"n": n}, retry=0) for n in range(10)], on_complete=sig("wfp.complete"),
                on_success=sig("wfp.success"), on_failure=sig("wfp.failure")).produce(clients[0])
    members, (complete, success, failure) = ids[:10], ids[10:]
    storage = two_brokers[0].storage
    wait_until(lambda: storage.dependencies.workflow(ids[0]).finished_at is not None, 30, what="the batch's end")
    assert sorted(ran["wfp.member"]) == sorted(members)
    assert (ran["wfp.complete"], ran["wfp.failure"], ran.get("wfp.success")) == ([complete], [failure], None)
    assert storage.reads.get_message(success).status == "CANCELLED"
    row = storage.dependencies.workflow(ids[0])
    assert (row.policy, row.state, row.steps_total, row.steps_left, row.steps_failed) == (
        "continue", "FAILED", 13, 0, 3)
    # Counted after the commit that ended it: wait for the count, then check it is one.
    wait_until(lambda: _finished("FAILED") >= failed_before + 1, 10, what="the ended workflow counted")
    assert _finished("FAILED") == failed_before + 1  # one of the two brokers counted it, once


def test_a_chain_under_continue_runs_past_a_failure_and_a_batch_that_succeeds_skips_on_failure(
        two_brokers, clients, workers):
    ran = []

    def handler(message: Message) -> None:
        ran.append(message.data)
        if message.data == "fails":
            raise RuntimeError("boom")

    workers(clients[1], "wfp.chain", handler)
    succeeded_before = _finished("SUCCEEDED")
    first, second, third = chain(sig("wfp.chain", "fails", retry=0), sig("wfp.chain", "second"),
                                 sig("wfp.chain", "third"), policy="continue").produce(clients[0])
    storage = two_brokers[0].storage
    wait_until(lambda: storage.dependencies.workflow(first).finished_at is not None, 30, what="the chain's end")
    assert ran == ["fails", "second", "third"]
    assert storage.dependencies.workflow(first).state == "FAILED"
    assert storage.reads.get_message(second).deps_failed == 1
    ids = batch([sig("wfp.chain", "ok")], on_failure=sig("wfp.chain", "never")).produce(clients[1])
    wait_until(lambda: storage.dependencies.workflow(ids[0]).finished_at is not None, 30, what="the batch's end")
    assert "never" not in ran and storage.reads.get_message(ids[1]).status == "CANCELLED"
    assert storage.dependencies.workflow(ids[0]).state == "SUCCEEDED"
    wait_until(lambda: _finished("SUCCEEDED") >= succeeded_before + 1, 10, what="the ended workflow counted")
    assert _finished("SUCCEEDED") == succeeded_before + 1


def test_cancelling_a_workflow_cancels_what_has_not_run(two_brokers, clients, workers):
    started, release = threading.Event(), threading.Event()

    def slow(message: Message) -> None:
        started.set()
        while not release.wait(0.05):
            message.checkpoint()  # raises once the cancel reached the worker (a heartbeat: ttr/3)

    workers(clients[1], "wfp.slow", slow, ttr=3)
    handles = chain(sig("wfp.slow", 1), sig("wfp.next", 2), sig("wfp.next", 3)).produce(clients[0], result=True)
    assert started.wait(10)
    assert clients[0].cancel_workflow(handles) == 2  # the two steps not run yet
    storage = two_brokers[0].storage
    assert [storage.reads.get_message(h.id) for h in handles[1:]] == [None, None]
    assert storage.dependencies.workflow(handles[0].id).state == "CANCELLED"
    assert clients[1].cancel_workflow(handles[0].id, running=True) == 1  # the running one, marked
    wait_until(lambda: storage.reads.get_message(handles[0].id).status == "CANCELLED", 20, what="the cancel")
    release.set()
    row = storage.dependencies.workflow(handles[0].id)
    assert (row.state, row.steps_left, row.finished_at is not None) == ("CANCELLED", 0, True)
    with pytest.raises(Exception, match="workflow is named by its id"):
        clients[0].cancel_workflow("nope")


def test_the_last_two_steps_acked_at_once_through_two_brokers_end_the_workflow_once(two_brokers, clients):
    from tidemq import BatchConsumer

    a, b = clients
    root, *ids = a.submit(_fan_out(6))
    roots = BatchConsumer("wfp.root", ttr=30, client=a)
    [got] = roots.pull(max_messages=10, wait=10)
    roots.ack(succeeded=[got.id])
    on_a, on_b = (BatchConsumer("wfp.race", ttr=30, client=client) for client in (a, b))
    held_a = on_a.pull(max_messages=5, wait=10)
    held_b = on_b.pull(max_messages=5, wait=10)
    assert sorted(m.id for m in held_a + held_b) == sorted(ids) and len(held_b) == 1
    on_a.ack(succeeded=[m.id for m in held_a[:4]])
    succeeded_before = _finished("SUCCEEDED")
    ack_at_once((on_a, held_a[4]), (on_b, held_b[0]))
    row = two_brokers[0].storage.dependencies.workflow(root)
    assert (row.state, row.steps_left, row.finished_at is not None) == ("SUCCEEDED", 0, True)
    assert _finished("SUCCEEDED") == succeeded_before + 1  # one broker's transaction ended it


def _fan_out(n):
    """A root and ``n`` steps after it (a workflow needs an edge: steps that wait on nothing are
    plain messages)."""
    from tidemq import Workflow

    wf = Workflow()
    root = wf.add("wfp.root")
    for i in range(n):
        wf.add("wfp.race", {"n": i}, after=[root])
    return wf
