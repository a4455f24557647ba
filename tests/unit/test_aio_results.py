"""tidemq.aio's handles and the batch consumers' results, against an embedded broker (SQLite,
in-process coordination, real gRPC): ``await handle`` waits for the result, a failure re-raises
typed, a running message is cancelled, and BatchConsumer.ack stores results or refuses bad ones
before anything is sent."""

from __future__ import annotations

import asyncio
import json

import pytest

from tidemq import BatchConsumer, Settings
from tidemq.aio import AsyncClient, AsyncHandle
from tidemq.aio import BatchConsumer as AsyncBatchConsumer
from tidemq.errors import InvalidResultError, MalformedRequestError, MessageNotFoundError, RemoteError
from tidemq.lifecycle import MessageStatus
from tidemq.link import AckItem


@pytest.fixture
def embedded_broker(tmp_path):
    from tidemq_cli.embedded import embedded

    broker, client = embedded(str(tmp_path / "aio.sqlite3"))
    yield broker, client
    client.close()
    broker.stop(grace=1)
    broker.coordinator.stop()


def test_await_a_handle_for_its_result_and_a_typed_failure(embedded_broker):
    broker, sync = embedded_broker

    async def scenario():
        async with AsyncClient(Settings(brokers=(broker.address,))) as client:
            ok, bad = await client.produce_many("aio.r", [1, 2], retry=0, result=True)
            assert isinstance(ok, AsyncHandle) and await ok.status() is MessageStatus.NEW
            [a, b] = sync.pull("aio.r", "c1", max_messages=2, wait=5)
            waiting = asyncio.ensure_future(ok)  # awaiting the handle awaits its result
            await asyncio.sleep(0)
            error = json.dumps({"type": "app.Boom", "message": "no", "traceback": "tb"})
            await asyncio.get_running_loop().run_in_executor(None, lambda: sync.ack("aio.r", "c1", [
                AckItem(a.id, a.lease_token, True, result='{"v": 1}'),
                AckItem(b.id, b.lease_token, False, "no", error)]))
            assert await asyncio.wait_for(waiting, 20) == {"v": 1}
            with pytest.raises(RemoteError) as info:
                await client.handle(bad.id).result(timeout=5)
            assert (info.value.type, info.value.message) == ("app.Boom", "no")
            with pytest.raises(MessageNotFoundError):
                await client.handle(10 ** 9)

    asyncio.run(scenario())


def test_an_async_cancel_marks_a_running_message(embedded_broker):
    broker, sync = embedded_broker

    async def scenario():
        async with AsyncClient(Settings(brokers=(broker.address,))) as client:
            handle = await client.produce("aio.c", 1, result=True)
            sync.pull("aio.c", "c1", wait=5)
            assert await handle.cancel(running=True) is True
            assert (await handle.state()).cancel_requested

    asyncio.run(scenario())


def test_batch_consumers_store_results_and_refuse_bad_ones_before_sending(embedded_broker):
    broker, client = embedded_broker
    ids = client.produce_many("batch.r", [1, 2, 3])
    consumer = BatchConsumer("batch.r", ttr=30, client=client)
    batch = consumer.pull(max_messages=3, wait=5)
    assert sorted(m.id for m in batch) == ids
    with pytest.raises(InvalidResultError, match="JSON-serialisable"):
        consumer.ack(succeeded=[ids[0]], results={ids[0]: object()})
    with pytest.raises(MalformedRequestError, match="not among the succeeded ids"):
        consumer.ack(succeeded=[ids[0]], results={ids[1]: 1})
    assert {s.status for s in client.results(ids)} == {MessageStatus.RUNNING}  # nothing was sent
    consumer.ack(succeeded=ids[:2], failed=[ids[2]], results={ids[0]: {"total": 10}})
    states = client.results(ids)
    assert [(s.status, s.result) for s in states[:2]] == [(MessageStatus.SUCCESS, '{"total":10}'),
                                                          (MessageStatus.SUCCESS, None)]

    async def aio_batch():
        async with AsyncClient(Settings(brokers=(broker.address,))) as aclient:
            [new] = await aclient.produce_many("batch.a", [7])
            aconsumer = AsyncBatchConsumer("batch.a", ttr=30, client=aclient)
            [m] = await aconsumer.pull(max_messages=1, wait=5)
            await aconsumer.ack(succeeded=[m.id], results={m.id: [m.data]})
            [state] = await aclient.results([new])
            return state

    state = asyncio.run(aio_batch())
    assert (state.status, state.result) == (MessageStatus.SUCCESS, "[7]")


def test_the_module_level_calls_return_handles_and_cancel_running_messages(embedded_broker, monkeypatch):
    import tidemq

    broker, client = embedded_broker
    monkeypatch.setattr(tidemq, "_client", client)  # the process-wide client, for this test only
    handle = tidemq.produce("mod.r", {"n": 1}, result=True)
    assert isinstance(handle, tidemq.Handle) and tidemq.handle(handle.id) == handle
    [plain] = tidemq.produce_many("mod.r", [2])
    assert isinstance(plain, int)
    client.pull("mod.r", "c1", max_messages=2, wait=5)
    assert tidemq.cancel(handle.id) is False  # running: not deleted without running=True
    assert tidemq.cancel(handle.id, running=True) is True
    assert tidemq.handle(handle.id).state().cancel_requested
    assert tidemq.handle(handle.id).status() is MessageStatus.RUNNING


def test_the_handle_functions_stay_functions_once_every_client_module_is_loaded():
    import importlib

    import tidemq
    import tidemq.aio

    for name in ("tidemq.client", "tidemq.stub", "tidemq.handles", "tidemq.aio.client", "tidemq.aio.handles"):
        importlib.import_module(name)
    assert callable(tidemq.handle) and callable(tidemq.aio.handle)
    assert tidemq.Handle.__name__ == "Handle"
