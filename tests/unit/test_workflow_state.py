"""The broker's Workflow call: a workflow's row, the long-poll until it ends (woken by this
broker's ack of its open step, or by the probe when another writer ends it), the topics a
caller must be allowed, and the client's record of the answer."""

from __future__ import annotations

import threading
from datetime import datetime

import grpc
import pytest

from tests.unit.test_broker_service import Aborted, Context
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.auth import CALLER
from tidemq_broker.pulls import PullHub
from tidemq_broker.results import ResultHub
from tidemq_broker.service import BrokerService
from tidemq_broker.storage import Principal
from tidemq_broker.storages.memory import open_memory_storage
from tidemq_broker.topics import TopicCache
from tidemq_broker.writer import GroupCommitWriter


@pytest.fixture
def broker():
    storage = open_memory_storage()
    topics = TopicCache(storage.topics)
    hub = PullHub(storage.probes, recheck=60)
    writer = GroupCommitWriter(storage.messages, topics, "b:1", hub.notify_commit)
    results = ResultHub(storage.probes, probe_interval=0.02, recheck=60)
    results.start()
    service = BrokerService(storage, topics, writer, hub, "b:1", max_data_bytes=1024, results=results)
    yield service
    results.stop()
    writer.stop()


def _chain(broker, *topics):
    messages = [pb.NewMessage(topic=topic, data="1", retry=-1, after=[n - 1] if n else [])
                for n, topic in enumerate(topics)]
    return list(broker.Produce(pb.ProduceRequest(messages=messages), Context()).ids)


def _run_one(broker, topic, success=True):
    [delivery] = broker.Pull(pb.PullRequest(topic=topic, consumer="c", max_messages=1, total=1), Context()).messages
    item = pb.AckItem(id=delivery.id, lease_token=delivery.lease_token, success=success, error="" if success else "x")
    assert list(broker.Ack(pb.AckRequest(consumer="c", items=[item]), Context()).outcomes) == [pb.APPLIED]
    return delivery.id


def _waiter(broker, id, wait):
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault(
        "reply", broker.Workflow(pb.WorkflowRequest(id=id, wait_seconds=wait), Context())))
    thread.start()
    return thread, answer


def _waiting(broker, step):
    """Block until a waiter sleeps on ``step`` in the result hub (so the test acks after it)."""
    for _ in range(2000):
        with broker.results._lock:
            if step in broker.results._waiters:
                return
        threading.Event().wait(0.005)
    raise AssertionError(f"nobody waits on step {step}")


def test_a_workflow_is_read_running_then_a_waiter_wakes_on_its_last_steps_ack(broker):
    first, second, third = _chain(broker, "s.a", "s.b", "s.c")
    now = broker.Workflow(pb.WorkflowRequest(id=first), Context())
    assert (now.found, now.policy, now.state, now.steps_total, now.steps_left, now.steps_failed, now.finished_ms) == \
        (True, "stop", "RUNNING", 3, 3, 0, 0)
    assert now.created_ms > 0
    thread, answer = _waiter(broker, first, 30)
    _waiting(broker, third)  # the tail: it ends last
    _run_one(broker, "s.a")
    _run_one(broker, "s.b")
    assert thread.is_alive()  # two steps ended, the workflow did not
    _run_one(broker, "s.c")
    thread.join(10)
    reply = answer["reply"]
    assert (reply.state, reply.steps_left, reply.steps_failed) == ("SUCCEEDED", 0, 0)
    assert reply.finished_ms >= reply.created_ms > 0


def test_a_chord_whose_member_failed_under_policy_continue_ends_failed_after_its_callback(broker):
    messages = [pb.NewMessage(topic="g.m", data=str(n), retry=0) for n in range(3)]
    messages.append(pb.NewMessage(topic="g.z", data="0", retry=-1, after=[0, 1, 2], wait_mode=1))
    first, *_ = broker.Produce(pb.ProduceRequest(messages=messages), Context()).ids
    thread, answer = _waiter(broker, first, 30)
    for n in range(3):
        _run_one(broker, "g.m", success=n != 1)
    _run_one(broker, "g.z")
    thread.join(10)
    assert (answer["reply"].state, answer["reply"].steps_failed, answer["reply"].policy) == ("FAILED", 1, "continue")


def test_a_wait_moves_to_the_next_open_step_when_the_highest_ends_first(broker):
    messages = [pb.NewMessage(topic="n.x", data="1", retry=-1),
                pb.NewMessage(topic="n.y", data="2", retry=-1, after=[0]),
                pb.NewMessage(topic="n.z", data="3", retry=-1)]
    x, y, z = broker.Produce(pb.ProduceRequest(messages=messages), Context()).ids
    thread, answer = _waiter(broker, x, 30)
    _waiting(broker, z)  # the highest id: it does not end last here
    _run_one(broker, "n.z")
    _waiting(broker, y)
    assert thread.is_alive()
    _run_one(broker, "n.x")
    _run_one(broker, "n.y")
    thread.join(10)
    assert (answer["reply"].state, answer["reply"].steps_total) == ("SUCCEEDED", 3)


def test_a_waiter_wakes_when_another_writer_ends_the_workflow(broker):
    first, _ = _chain(broker, "o.a", "o.b")
    thread, answer = _waiter(broker, first, 30)
    _waiting(broker, _)
    # Not through this broker's calls: only the result hub's probe can see it.
    broker.storage.dependencies.cancel_workflows([first], False, datetime(2026, 1, 1), broker="other")
    thread.join(10)
    assert answer["reply"].state == "CANCELLED"


def test_a_workflow_cancelled_whole_ends_when_its_marked_running_step_stops(broker):
    first, _ = _chain(broker, "k.a", "k.b")
    [delivery] = broker.Pull(pb.PullRequest(topic="k.a", consumer="c", max_messages=1, total=1), Context()).messages
    assert len(broker.Cancel(pb.CancelRequest(ids=[first], workflow=True, running=True), Context()).cancelled) == 2
    now = broker.Workflow(pb.WorkflowRequest(id=first), Context())
    assert (now.state, now.steps_left, now.finished_ms) == ("CANCELLED", 1, 0)
    thread, answer = _waiter(broker, first, 30)
    _waiting(broker, first)
    item = pb.AckItem(id=delivery.id, lease_token=delivery.lease_token, cancelled=True)
    broker.Ack(pb.AckRequest(consumer="c", items=[item]), Context())
    thread.join(10)
    assert (answer["reply"].state, answer["reply"].steps_left) == ("CANCELLED", 0)
    assert answer["reply"].finished_ms > 0


def test_a_wait_ends_at_its_deadline_running_and_unknown_or_bad_ids_are_answered(broker):
    first, _ = _chain(broker, "d.a", "d.b")
    assert broker.Workflow(pb.WorkflowRequest(id=first, wait_seconds=0.05), Context()).state == "RUNNING"
    assert broker.Workflow(pb.WorkflowRequest(id=first + 100, wait_seconds=0.05), Context()) == \
        pb.WorkflowReply(found=False)
    for bad, expected in ((0, "positive"), (-3, "positive")):
        with pytest.raises(Aborted) as info:
            broker.Workflow(pb.WorkflowRequest(id=bad), Context())
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and expected in info.value.details
    with pytest.raises(Aborted) as info:
        broker.Workflow(pb.WorkflowRequest(id=first, wait_seconds=-1), Context())
    assert "wait_seconds" in info.value.details


def test_reading_a_workflow_needs_every_topic_of_its_steps(broker):
    first, _ = _chain(broker, "w.a", "other.b")
    cases = [("consumer", ("w.*",), False), ("consumer", ("w.*", "other.*"), True), ("producer", ("*",), True),
             ("admin", ("*",), True)]
    for role, patterns, allowed in cases:
        caller = CALLER.set(Principal("p", role, patterns, "0" * 64, datetime(2026, 1, 1)))
        try:
            if allowed:
                assert broker.Workflow(pb.WorkflowRequest(id=first), Context()).state == "RUNNING"
            else:
                with pytest.raises(Aborted) as denied:
                    broker.Workflow(pb.WorkflowRequest(id=first), Context())
                assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED
        finally:
            CALLER.reset(caller)
