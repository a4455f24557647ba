"""RESOURCE_EXHAUSTED from a broker that answered is an error of the call: the pool neither
moves the call to another broker nor sets the broker aside. Only a broker at its limit of
concurrent calls (which ran nothing) is passed over. Real gRPC servers stand in for brokers."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from tidemq.aio.pool import AsyncBrokerPool
from tidemq.errors import BrokerUnavailableError, MalformedRequestError, TidemqError
from tidemq.pool import BrokerPool
from tidemq.rpc import tidemq_pb2 as pb

REQUEST = pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data="1")])


class FakeBroker:
    """A gRPC server answering Produce through ``answer(context)``; counts the calls it got."""

    def __init__(self, answer, max_concurrent=None, options=()) -> None:
        self.calls = 0
        self._answer = answer

        def produce(request, context):
            self.calls += 1
            return self._answer(context)

        handler = grpc.method_handlers_generic_handler("tidemq.v1.Broker", {
            "Produce": grpc.unary_unary_rpc_method_handler(
                produce, request_deserializer=pb.ProduceRequest.FromString,
                response_serializer=pb.ProduceReply.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler],
                                  maximum_concurrent_rpcs=max_concurrent, options=list(options))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


def _huge_error(context):
    # 20 KiB of details: over the 16 KiB every default client refuses, as an echoed input did.
    context.set_trailing_metadata((("tidemq-error", "InvalidScheduleError"),))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "x" * 20_000)


def _ok(context):
    return pb.ProduceReply(ids=[7])


@pytest.fixture
def brokers():
    started = []

    def start(answer, **kw):
        broker = FakeBroker(answer, **kw)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


def test_an_answer_the_client_cannot_read_is_an_error_of_the_call_not_a_dead_broker(brokers):
    bad, good = brokers(_huge_error), brokers(_ok)
    pool = BrokerPool((bad.address, good.address))
    try:
        with pytest.raises(TidemqError) as info:
            pool.call("Produce", REQUEST, timeout=5)  # round robin: the first broker first
        assert not isinstance(info.value, BrokerUnavailableError)
        assert "RESOURCE_EXHAUSTED" in str(info.value) and bad.address in str(info.value)
        assert (bad.calls, good.calls) == (1, 0)  # not moved to the other broker
        # Not set aside either: round robin comes back to it on the call after next.
        assert pool.call("Produce", REQUEST, timeout=5).ids == [7]
        with pytest.raises(TidemqError):
            pool.call("Produce", REQUEST, timeout=5)
        assert (bad.calls, good.calls) == (2, 1)
    finally:
        pool.close()


def test_a_request_over_the_brokers_size_limit_is_an_input_error_naming_the_limit(brokers):
    small = brokers(_ok, options=[("grpc.max_receive_message_length", 1000)])
    pool = BrokerPool((small.address,))
    try:
        big = pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data='"' + "x" * 2000 + '"')])
        with pytest.raises(MalformedRequestError, match=r"over the limit of 1,000 bytes per call"):
            pool.call("Produce", big, timeout=5)
        assert small.calls == 0  # refused before it ran
    finally:
        pool.close()


def test_a_busy_broker_passes_the_call_to_another(brokers):
    release = threading.Event()

    def hold(context):
        release.wait(10)
        return pb.ProduceReply(ids=[1])

    busy, free = brokers(hold, max_concurrent=1), brokers(_ok)
    holder = grpc.insecure_channel(busy.address)
    pending = holder.unary_unary("/tidemq.v1.Broker/Produce", request_serializer=pb.ProduceRequest.SerializeToString,
                                 response_deserializer=pb.ProduceReply.FromString).future(REQUEST, timeout=10)
    pool = BrokerPool((busy.address, free.address))
    try:
        from tests.servers import wait_until

        wait_until(lambda: busy.calls == 1, 10, what="the busy broker's one call")
        assert pool.call("Produce", REQUEST, timeout=5).ids == [7]  # refused by the busy one, answered by the other
        assert free.calls == 1
    finally:
        release.set()
        pending.result()
        holder.close()
        pool.close()


@pytest.mark.asyncio
async def test_the_async_pool_classifies_it_alike(brokers):
    bad, good = brokers(_huge_error), brokers(_ok)
    pool = AsyncBrokerPool((bad.address, good.address))
    try:
        with pytest.raises(TidemqError) as info:
            await pool.acall("Produce", REQUEST, timeout=5)
        assert not isinstance(info.value, BrokerUnavailableError) and "RESOURCE_EXHAUSTED" in str(info.value)
        assert (bad.calls, good.calls) == (1, 0)
    finally:
        await pool.aclose()
