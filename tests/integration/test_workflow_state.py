"""Reading a workflow's state from a client, with real workers on two brokers over MariaDB and
ZooKeeper: a chain read RUNNING, then SUCCEEDED by a wait the other broker's commit ended; a
failing step ends its workflow FAILED; a workflow handle waits, times out and cancels; the
asyncio client submits a shape and awaits its workflow; an unknown id is MessageNotFoundError."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.servers import wait_until
from tidemq import Message, MessageType, Settings, Worker, chain, sig
from tidemq.aio import AsyncClient
from tidemq.consumer import ConsumerSpec
from tidemq.dependencies import FailurePolicy, WorkflowState
from tidemq.errors import MessageNotFoundError, ResultTimeoutError


@pytest.fixture
def workers():
    started = []

    def start(client, topic, handler):
        spec = ConsumerSpec(topic, MessageType.QUEUE, handler, threads=2, ttr=30, batch=4)
        started.append(Worker([spec], client=client, drain_timeout=5).start())
        wait_until(lambda: client.coordinator.consumers(topic), 10, what="consumer registration")

    yield start
    for worker in started:
        worker.stop()


def test_a_chain_is_read_running_then_succeeded_by_a_wait_another_broker_ended(clients, workers):
    reader, runner = clients  # the steps are leased and acked through the second broker only
    gate, ran = threading.Event(), []

    def handler(message: Message) -> int:
        gate.wait(30)
        ran.append(message.data)
        return message.data

    workers(runner, "wfs.step", handler)
    ids = chain(sig("wfs.step", 1), sig("wfs.step", 2), sig("wfs.step", 3)).produce(runner)
    now = reader.workflow_state(ids)
    assert (now.id, now.policy, now.state, now.steps_total, now.steps_left, now.steps_failed, now.finished_at) == \
        (ids[0], FailurePolicy.STOP, WorkflowState.RUNNING, 3, 3, 0, None)
    assert not now.finished
    assert reader.workflow_state(ids[0], wait=0.2).state is WorkflowState.RUNNING  # its wait ran out
    gate.set()
    done = reader.workflow_state(ids, wait=30)
    assert ran == [1, 2, 3]
    assert (done.state, done.steps_left, done.steps_failed) == (WorkflowState.SUCCEEDED, 0, 0)
    assert done.finished_at is not None and done.finished_at >= done.created_at
    assert runner.workflow_handle(ids).state() == done  # any broker, any way of naming it


def test_a_failing_step_ends_its_workflow_failed_and_a_handle_waits_times_out_and_cancels(clients, workers):
    reader, runner = clients
    gate = threading.Event()

    def handler(message: Message) -> None:
        if message.data == "fails":
            raise RuntimeError("this step fails")
        gate.wait(30)

    workers(runner, "wfs.fail", handler)
    ids = chain(sig("wfs.fail", "fails", retry=0), sig("wfs.fail", "never")).produce(runner)
    failed = reader.workflow_handle(ids[0]).wait(timeout=30)
    assert (failed.state, failed.steps_left, failed.steps_failed) == (WorkflowState.FAILED, 0, 2)

    ids = chain(sig("wfs.fail", "holds"), sig("wfs.fail", "after")).produce(reader)
    handle = reader.workflow_handle(ids)
    wait_until(lambda: reader.handle(ids[0]).status().value == "RUNNING", 30, what="the first step running")
    with pytest.raises(ResultTimeoutError, match=rf"workflow {ids[0]} has not ended after 0.2 s \(RUNNING, 2 of 2"):
        handle.wait(timeout=0.2)
    assert handle.cancel(running=True) == 2  # the WAITING step removed, the RUNNING one marked
    cancelled = handle.state()  # CANCELLED at once, but its running step has not stopped
    assert (cancelled.state, cancelled.steps_left, cancelled.finished) == (WorkflowState.CANCELLED, 1, False)
    with pytest.raises(ResultTimeoutError, match=r"\(CANCELLED, 1 of 2 steps left\)"):
        handle.wait(timeout=0.2)
    gate.set()  # the handler returns without looking at its cancel: that step succeeded
    ended = handle.wait(timeout=30)
    assert (ended.state, ended.steps_left, ended.steps_failed, ended.finished) == (WorkflowState.CANCELLED, 0, 1, True)


def test_an_unknown_workflow_is_message_not_found_naming_its_id(clients, two_brokers):
    [last] = clients[0].produce_many("wfs.plain", [1])  # a message, but no workflow's first step
    for unknown in (last, last + 10 ** 9):
        with pytest.raises(MessageNotFoundError, match=f"workflow {unknown} is not stored"):
            clients[0].workflow_state(unknown, wait=0.1)
        with pytest.raises(MessageNotFoundError, match=f"workflow {unknown}"):
            clients[1].workflow_handle(unknown).state()


def test_the_asyncio_client_submits_a_shape_and_awaits_its_workflow(clients, workers, two_brokers, settings):
    workers(clients[1], "wfs.aio", lambda message: message.data * 2)

    async def run():
        client = AsyncClient(Settings.from_env({}, brokers=two_brokers[0].address, zk_hosts=settings.zk_hosts))
        try:
            handles = await chain(sig("wfs.aio", 1), sig("wfs.aio", 2)).produce(client, result=True)
            ended = await client.workflow_handle(handles)
            with pytest.raises(MessageNotFoundError, match=f"workflow {handles[1].id}"):
                await client.workflow_state(handles[1].id)
            workflow = await chain(sig("wfs.aio", 3), sig("wfs.aio", 4), sig("wfs.aio", 5)).produce(client, handle=True)
            return ended, [await handle for handle in handles], await workflow
        finally:
            await client.close()

    ended, values, other = asyncio.run(run())
    assert (ended.state, ended.steps_total, values) == (WorkflowState.SUCCEEDED, 2, [2, 4])
    assert (other.state, other.steps_total, other.steps_left) == (WorkflowState.SUCCEEDED, 3, 0)
