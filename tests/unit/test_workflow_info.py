"""The client's side of a workflow's state: the record it makes of the broker's answer, a wait
split into long-polls of at most MAX_WAIT, the errors of bad input and of an unknown workflow,
workflow handles, and the shapes tidemq.aio offers producing through an AsyncClient."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime

import pytest

import tidemq
import tidemq.aio
from tidemq import Client, Settings
from tidemq.canvas import batch as canvas_batch
from tidemq.dependencies import FailurePolicy, WorkflowState
from tidemq.errors import MalformedRequestError, MessageNotFoundError, ResultTimeoutError
from tidemq.limits import MAX_WAIT
from tidemq.rpc import tidemq_pb2 as pb
from tidemq.workflow_handles import AsyncWorkflowHandle, WorkflowHandle
from tidemq.workflow_info import WorkflowInfo, workflow_info, workflow_request

RUNNING = pb.WorkflowReply(found=True, policy="stop", state="RUNNING", steps_total=3, steps_left=2,
                           created_ms=1_790_000_000_000)
ENDED = pb.WorkflowReply(found=True, policy="continue", state="FAILED", steps_total=3, steps_failed=1,
                         created_ms=1_790_000_000_000, finished_ms=1_790_000_001_500)


def test_the_brokers_answer_becomes_a_record_and_not_found_names_the_workflow():
    info = workflow_info(7, RUNNING)
    assert info == WorkflowInfo(7, FailurePolicy.STOP, WorkflowState.RUNNING, 3, 2, 0,
                                datetime(2026, 9, 21, 14, 13, 20), None)
    assert not info.finished
    ended = workflow_info(7, ENDED)
    assert (ended.policy, ended.state, ended.finished, ended.steps_failed) == \
        (FailurePolicy.CONTINUE, WorkflowState.FAILED, True, 1)
    assert (ended.finished_at - ended.created_at).total_seconds() == 1.5
    with pytest.raises(MessageNotFoundError, match="workflow 42 is not stored"):
        workflow_info(42, pb.WorkflowReply(found=False))


def test_a_workflow_is_named_by_its_id_a_handle_or_what_submit_returned():
    assert workflow_request(5, 1.5) == pb.WorkflowRequest(id=5, wait_seconds=1.5)
    assert workflow_request([5, 6], 0).id == 5
    assert workflow_request(tidemq.Handle(5, None), 0).id == 5
    for bad in (0, -1, "5", None, True, []):
        with pytest.raises(MalformedRequestError, match="a workflow is named by its id"):
            workflow_request(bad, 0)


class _Pool:
    """A broker pool answering Workflow calls from ``replies``, recording each request; each
    call takes as long as it may wait on the clock ``now`` (the broker's deadline ran out)."""

    def __init__(self, *replies):
        self.replies, self.calls, self.now = list(replies), [], 1000.0

    def call(self, method, request, timeout, **_):
        self.calls.append((method, request.id, request.wait_seconds, timeout))
        self.now += request.wait_seconds
        return self.replies.pop(0)

    def close(self):
        pass


@pytest.fixture
def client():
    made = Client(Settings.from_env({}, brokers="127.0.0.1:1"))
    yield made
    made.close()


def test_a_long_wait_is_long_polls_of_at_most_max_wait_until_the_workflow_ends(client, monkeypatch):
    monkeypatch.setattr("tidemq.workflow_info.monotonic", lambda: client.pool.now)
    client.pool = _Pool(RUNNING, RUNNING, ENDED)
    assert client.workflow_state([9, 10], wait=None).state is WorkflowState.FAILED
    assert [(method, id, wait) for method, id, wait, _ in client.pool.calls] == [("Workflow", 9, MAX_WAIT)] * 3
    assert all(timeout > MAX_WAIT for *_, timeout in client.pool.calls)  # the wait plus the RPC timeout
    client.pool = _Pool(RUNNING)
    assert client.workflow_state(9).state is WorkflowState.RUNNING  # no wait: one read
    assert client.pool.calls[0][2] == 0
    client.pool = _Pool(RUNNING, RUNNING, ENDED)
    assert client.workflow_state(9, wait=MAX_WAIT + 1.5).state is WorkflowState.RUNNING  # still, at its end
    assert [wait for _, _, wait, _ in client.pool.calls] == [MAX_WAIT, 1.5]


def test_a_bad_wait_is_refused_before_any_call(client):
    client.pool = _Pool()
    for bad in (-1, math.nan, "10"):
        with pytest.raises(MalformedRequestError, match="wait is a number of seconds"):
            client.workflow_state(9, wait=bad)
    assert client.pool.calls == []


class _Source:
    def __init__(self, *infos):
        self.infos, self.asked, self.cancelled = list(infos), [], []

    def workflow_state(self, workflow, wait=0.0, timeout=None):
        self.asked.append((workflow, wait))
        return self.infos.pop(0)

    def cancel_workflow(self, workflow, timeout=None, *, running=False):
        self.cancelled.append((workflow, running))
        return 2


def test_a_workflow_handle_reads_waits_and_cancels_and_a_wait_that_runs_out_says_so():
    source = _Source(workflow_info(9, RUNNING), workflow_info(9, ENDED), workflow_info(9, RUNNING))
    handle = WorkflowHandle(9, source)
    assert handle.state().state is WorkflowState.RUNNING
    assert handle.wait(timeout=5).state is WorkflowState.FAILED
    with pytest.raises(ResultTimeoutError,
                       match=r"workflow 9 has not ended after 0.5 s \(RUNNING, 2 of 3 steps left\)"):
        handle.wait(timeout=0.5)
    assert source.asked == [(9, 0.0), (9, 5), (9, 0.5)]
    assert handle.cancel() == 2 and handle.cancel(running=True) == 2
    assert source.cancelled == [(9, False), (9, True)]
    assert handle == WorkflowHandle(9, None) and repr(handle) == "WorkflowHandle(9)"
    assert handle != tidemq.Handle(9, None)


def test_an_async_workflow_handle_is_awaited_for_the_end():
    class Source(_Source):
        async def workflow_state(self, workflow, wait=0.0, timeout=None):
            return _Source.workflow_state(self, workflow, wait, timeout)

        async def cancel_workflow(self, workflow, timeout=None, *, running=False):
            return _Source.cancel_workflow(self, workflow, timeout, running=running)

    source = Source(workflow_info(9, ENDED), workflow_info(9, RUNNING))

    async def run():
        handle = AsyncWorkflowHandle(9, source)
        ended = await handle
        with pytest.raises(ResultTimeoutError):
            await handle.wait(timeout=0)
        return ended, await handle.cancel(running=True)

    ended, cancelled = asyncio.run(run())
    assert (ended.state, cancelled, source.asked) == (WorkflowState.FAILED, 2, [(9, None), (9, 0)])


def test_tidemq_aio_offers_the_shapes_and_their_produce_awaits_an_async_client():
    assert (tidemq.aio.sig, tidemq.aio.chain, tidemq.aio.group, tidemq.aio.chord, tidemq.aio.batch) == \
        (tidemq.sig, tidemq.chain, tidemq.group, tidemq.chord, canvas_batch)
    from tidemq.aio.batch import BatchConsumer  # the submodule of that name is still importable

    assert tidemq.aio.BatchConsumer is BatchConsumer and tidemq.aio.batch is canvas_batch

    class AsyncSubmitter:
        async def submit(self, workflow, timeout=None, result=False):
            return [len(msg.after) for msg in workflow.messages(1 << 20)], result

    shape = tidemq.aio.chord(tidemq.aio.group(tidemq.aio.sig("a.m", n) for n in range(2)), tidemq.aio.sig("a.z"))
    assert asyncio.run(shape.produce(AsyncSubmitter(), result=True)) == ([0, 0, 2], True)
    assert asyncio.run(tidemq.aio.batch([tidemq.aio.sig("a.m")], on_complete=tidemq.aio.sig("a.z"))
                       .produce(AsyncSubmitter())) == ([0, 1], False)


def test_a_shapes_produce_returns_a_workflow_handle_on_the_stub_and_through_an_async_client():
    from tidemq.stub import StubBroker

    stub = StubBroker()
    handle = tidemq.chain(tidemq.sig("h.a"), tidemq.sig("h.b")).produce(stub, handle=True)
    assert isinstance(handle, WorkflowHandle) and handle.id == stub.ids("h.a")[0]
    assert handle.state().steps_left == 2
    with pytest.raises(TypeError, match="not both"):
        tidemq.chain(tidemq.sig("h.a"), tidemq.sig("h.b")).produce(stub, result=True, handle=True)
    assert len(stub.ids()) == 2  # the refused call stored nothing

    class AsyncSubmitter:
        async def submit(self, workflow, timeout=None, result=False):
            return [41, 42]

        def workflow_handle(self, ids):
            return AsyncWorkflowHandle(ids[0], self)

    made = asyncio.run(tidemq.aio.chain(tidemq.aio.sig("h.a"), tidemq.aio.sig("h.b")).produce(AsyncSubmitter(),
                                                                                              handle=True))
    assert isinstance(made, AsyncWorkflowHandle) and made.id == 41
