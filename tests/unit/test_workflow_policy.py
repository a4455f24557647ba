"""The client's failure policies and batches, as the messages they send: each step's wait mode,
and the errors a bad policy, mode or batch gets before anything is sent; the broker's intake of
the wait mode."""

from __future__ import annotations

import pytest

import tidemq
from tidemq import Workflow, batch, chain, chord, group, sig
from tidemq.dependencies import WaitMode
from tidemq.errors import DependencyError, MalformedRequestError
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.rpc_build import cancel_workflow_request
from tidemq_broker.intake import steps_from_request


def _modes(shape):
    return [(list(msg.after), msg.wait_mode) for msg in shape.workflow().messages(1 << 20)]


def test_a_workflows_policy_sets_the_wait_mode_of_its_steps_with_dependencies():
    assert _modes(chain(sig("p.a"), sig("p.b"), sig("p.c"))) == [([], 0), ([0], 0), ([1], 0)]
    assert _modes(chain(sig("p.a"), sig("p.b"), policy="continue")) == [([], 0), ([0], WaitMode.AFTER_COMPLETE)]
    assert _modes(chord(group(sig("p.a"), sig("p.b")), sig("p.z"), policy="continue")) == \
        [([], 0), ([], 0), ([0, 1], WaitMode.AFTER_COMPLETE)]
    wf = Workflow("continue")
    first = wf.add("p.a")
    wf.add("p.b", after=[first], wait_mode=WaitMode.AFTER_FAILURE)
    assert [msg.wait_mode for msg in wf.messages(1 << 20)] == [0, WaitMode.AFTER_FAILURE]


def test_a_batch_puts_each_callback_after_every_member_with_its_mode():
    shape = batch([sig("b.m", n) for n in range(3)], on_complete=sig("b.done"), on_success=sig("b.ok"),
                  on_failure=chain(sig("b.alert"), sig("b.page")))
    assert _modes(shape) == [([], 0), ([], 0), ([], 0), ([0, 1, 2], WaitMode.AFTER_COMPLETE),
                             ([0, 1, 2], WaitMode.AFTER_SUCCESS), ([0, 1, 2], WaitMode.AFTER_FAILURE),
                             ([5], WaitMode.AFTER_SUCCESS)]
    assert _modes(batch(sig("b.only"))) == [([], 0)]
    assert tidemq.batch is batch  # the package's batch, though tidemq.batch is also a module
    from tidemq.batch import BatchConsumer  # noqa: F401  (the module is still there)
    assert tidemq.batch is batch


def test_bad_policies_modes_and_batches_are_refused_before_anything_is_sent():
    with pytest.raises(DependencyError, match="policy is one of 'stop', 'continue', got 'maybe'"):
        Workflow("maybe")
    wf = Workflow()
    with pytest.raises(DependencyError, match="needs dependencies"):
        wf.add("p.a", wait_mode=WaitMode.AFTER_COMPLETE)
    with pytest.raises(DependencyError, match=r"wait_mode must be one of 0 \(after_success\)"):
        wf.add("p.b", after=[wf.add("p.a")], wait_mode=5)
    with pytest.raises(ValueError, match="at least one item"):
        batch([], on_complete=sig("b.done"))
    with pytest.raises(TypeError, match="callback"):
        batch([sig("b.m")], on_failure="b.alert")
    with pytest.raises(MalformedRequestError, match="workflow is named by its id"):
        cancel_workflow_request(0)
    request = cancel_workflow_request([7, 8], running=True)
    assert (list(request.ids), request.running, request.workflow) == ([7], True, True)


def test_the_broker_refuses_a_wait_mode_out_of_range_or_without_dependencies():
    rows = [object(), object()]
    bad = pb.ProduceRequest(messages=[pb.NewMessage(topic="t"), pb.NewMessage(topic="t", after=[0], wait_mode=3)])
    with pytest.raises(MalformedRequestError, match=r"message #1: wait_mode must be one of .*got 3"):
        steps_from_request(bad, rows)
    alone = pb.ProduceRequest(messages=[pb.NewMessage(topic="t", wait_mode=1)])
    with pytest.raises(MalformedRequestError, match="wait_mode 1 needs dependencies"):
        steps_from_request(alone, rows[:1])
    good = pb.ProduceRequest(messages=[pb.NewMessage(topic="t"), pb.NewMessage(topic="t", after=[0], wait_mode=2)])
    assert [step.wait_mode for step in steps_from_request(good, rows)] == [0, 2]


def test_the_broker_takes_wait_modes_and_cancels_a_workflow_on_the_topics_a_caller_may_use():
    from datetime import datetime

    import grpc

    from tests.unit.test_broker_service import Aborted, Context
    from tidemq_broker.auth import CALLER
    from tidemq_broker.pulls import PullHub
    from tidemq_broker.service import BrokerService
    from tidemq_broker.storage import Principal
    from tidemq_broker.storages.memory import open_memory_storage
    from tidemq_broker.topics import TopicCache
    from tidemq_broker.writer import GroupCommitWriter

    storage = open_memory_storage()
    topics = TopicCache(storage.topics)
    hub = PullHub(storage.probes, recheck=60)
    writer = GroupCommitWriter(storage.messages, topics, "b:1", hub.notify_commit)
    broker = BrokerService(storage, topics, writer, hub, "b:1", max_data_bytes=1024)
    try:
        request = pb.ProduceRequest(messages=[
            pb.NewMessage(topic="w.a", data="1", retry=-1),
            pb.NewMessage(topic="other.b", data="2", retry=-1, after=[0], wait_mode=1)])
        first, second = broker.Produce(request, Context()).ids
        assert storage.reads.get_message(second).wait_mode == WaitMode.AFTER_COMPLETE
        assert storage.dependencies.workflow(first).policy == "continue"
        caller = CALLER.set(Principal("p", "producer", ("w.*",), "0" * 64, datetime(2026, 1, 1)))
        try:
            with pytest.raises(Aborted) as denied:  # the workflow has a step of a topic it may not use
                broker.Cancel(pb.CancelRequest(ids=[first], workflow=True), Context())
            assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED
        finally:
            CALLER.reset(caller)
        assert storage.reads.get_message(first) is not None
        caller = CALLER.set(Principal("p", "producer", ("w.*", "other.*"), "0" * 64, datetime(2026, 1, 1)))
        try:
            assert list(broker.Cancel(pb.CancelRequest(ids=[first], workflow=True), Context()).cancelled) == \
                [True, True]
        finally:
            CALLER.reset(caller)
        assert storage.dependencies.workflow(first).state == "CANCELLED"
        assert list(broker.Cancel(pb.CancelRequest(ids=[first], workflow=True), Context()).cancelled) == []
    finally:
        writer.stop()
