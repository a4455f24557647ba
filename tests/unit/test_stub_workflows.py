"""Workflows unit-tested without servers: a Worker on the StubBroker runs a chain, a chord and a
DAG, each step reading its dependencies' results (``message.input``, ``inputs``, ``outcomes``);
a failure stops what waits on it (policy stop). The same rules on a real broker:
``tests/behaviour/test_dependencies.py``."""

from __future__ import annotations

import uuid

import pytest

from tidemq import Worker, Workflow, chain, chord, group, sig
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.local import LocalCoordinator
from tidemq.errors import MalformedRequestError, MessageCancelledError, RemoteError, WorkflowTooLargeError
from tidemq.limits import MAX_BATCH, MAX_DEPENDENCIES, MAX_WORKFLOW_STEPS
from tidemq.handles import Handle
from tidemq.lifecycle import MessageStatus
from tidemq.message import MessageType
from tidemq.stub import StubBroker


@pytest.fixture
def stub():
    return StubBroker()


@pytest.fixture
def start(stub):
    coordinator = LocalCoordinator(f"/test-{uuid.uuid4().hex[:8]}")
    coordinator.start()
    started = []

    def run(*handlers) -> None:
        specs = [ConsumerSpec(topic, MessageType.QUEUE, handler, ttr=3, batch=1, threads=2)
                 for topic, handler in handlers]
        started.append(Worker(specs, link=stub, coordinator=coordinator, drain_timeout=5).start())

    yield run
    for worker in started:
        worker.stop()
    coordinator.stop()


def test_a_chain_hands_each_result_to_the_next_step(stub, start):
    start(("w.add", lambda m: m.input + 1 if m.depends_on else m.data))
    ids = chain(sig("w.add", 1), sig("w.add"), sig("w.add")).produce(stub)
    assert [stub.status(i) for i in ids[1:]] == [MessageStatus.WAITING] * 2
    assert Handle(ids[-1], stub).result(timeout=10) == 3
    assert [stub.results([i])[0].result for i in ids] == ["1", "2", "3"]
    assert stub.parents(ids[2]) == (ids[1],) and stub.parents(ids[0]) == ()
    assert ("DEPENDENCY_MET", ids[1]) in stub.history


def test_a_chord_callback_gets_the_members_results_and_a_dag_joins_two_branches(stub, start):
    start(("w.square", lambda m: m.data ** 2), ("w.sum", lambda m: sum(m.inputs)),
          ("w.pair", lambda m: [o.result for o in m.outcomes]))
    ids = chord(group(*(sig("w.square", n) for n in range(1, 5))), sig("w.sum")).produce(stub)
    handles = stub.produce_many("w.square", [7], result=True)
    wf = Workflow()
    left, right = wf.add("w.square", 2), wf.add("w.square", 3)
    wf.add("w.pair", after=[right, left], depends_on=handles)
    dag = stub.submit(wf, result=True)
    assert Handle(ids[-1], stub).result(timeout=10) == 1 + 4 + 9 + 16
    # Ascending ids: the stored message first, then the steps in the order they were added.
    assert dag[-1].result(timeout=10) == [49, 4, 9]


def test_a_failed_step_stops_what_waits_on_it_and_a_cancel_of_a_pending_one_too(stub, start):
    def fails(message):
        raise ValueError("no such row")

    start(("w.fail", fails), ("w.after", lambda m: m.input))
    ids = chain(sig("w.fail", 1, retry=0), sig("w.after"), sig("w.after")).produce(stub)
    with pytest.raises(RemoteError, match="no such row"):
        Handle(ids[0], stub).result(timeout=10)
    assert [stub.status(i) for i in ids[1:]] == [MessageStatus.CANCELLED] * 2
    with pytest.raises(MessageCancelledError):
        Handle(ids[2], stub).result(timeout=1)
    pending = stub.produce("w.later", 1, delay=3600)
    waiting = stub.produce("w.after", None, depends_on=[pending])
    assert stub.cancel(pending) and stub.status(waiting) is MessageStatus.CANCELLED


def test_a_chord_of_a_whole_batch_is_one_submission_and_wider_shapes_are_refused_naming_the_limit(stub):
    ids = chord(group(sig("w.wide", n) for n in range(MAX_BATCH)), sig("w.done")).produce(stub)
    assert len(ids) == MAX_BATCH + 1 and stub.status(ids[-1]) == MessageStatus.WAITING
    assert stub.parents(ids[-1]) == tuple(ids[:-1])
    with pytest.raises(WorkflowTooLargeError, match="MAX_WORKFLOW_STEPS"):
        chord(group(sig("w.wider", n) for n in range(MAX_WORKFLOW_STEPS)), sig("w.done")).produce(stub)
    with pytest.raises(MalformedRequestError, match="MAX_DEPENDENCIES"):
        stub.produce("w.done", None, depends_on=ids[: MAX_DEPENDENCIES + 1])


class _RecordingAcks(StubBroker):
    def __init__(self) -> None:
        super().__init__()
        self.acked: list = []

    def ack(self, topic, consumer, items, timeout=None):
        self.acked.extend(items)
        return super().ack(topic, consumer, items, timeout)


@pytest.mark.parametrize("how", ["succeeded", "failed"])
def test_a_batch_consumers_ack_of_a_step_names_it_a_step_and_a_plain_message_not(how):
    from tidemq import BatchConsumer

    stub = _RecordingAcks()
    first, second = chain(sig("w.batch", 1), sig("w.batch", 2)).produce(stub)
    plain = stub.produce("w.batch", 3)
    consumer = BatchConsumer("w.batch", ttr=30, client=stub)
    pulled = consumer.pull(max_messages=10, wait=0)
    assert sorted(m.id for m in pulled) == sorted([first, plain])  # the second step waits
    done = consumer.ack(**{how: [first, plain]})
    assert sorted(done.applied) == sorted([first, plain])
    assert {item.id: item.workflow for item in stub.acked} == {first: True, plain: False}
    if how == "succeeded":  # the step's SUCCESS released the next one, which is a step too
        [step] = consumer.pull(max_messages=10, wait=0)
        assert step.id == second
        consumer.ack(succeeded=[second])
        assert stub.acked[-1].workflow is True
