"""Produce streams, client and broker side, over real gRPC servers: requests share one open
stream and each gets its own reply; a broker's error, a request past its deadline and a broker
that stops each end a stream without losing the next request; brokers that refuse streams (at
their limit, or without the method) get unary calls; idle streams are closed. The same in
tidemq.aio's pool."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest

from tests.servers import wait_until
from tidemq.aio.pool import AsyncBrokerPool
from tidemq.aio.produce_stream import AsyncProduceStreams
from tidemq.errors import BrokerUnavailableError, InvalidScheduleError
from tidemq.pool import BrokerPool
from tidemq.produce_stream import ProduceStreams
from tidemq.rpc import tidemq_pb2 as pb

from tidemq_broker.produce_streams import ProduceStreams as BrokerStreams


def _request(n: int) -> pb.ProduceRequest:
    return pb.ProduceRequest(messages=[pb.NewMessage(topic="t", data=str(n))], request_id=str(n))


class FakeBroker:
    """A gRPC server with Produce and (unless ``streams`` is None) ProduceStream, both answering
    ``answer(request)`` (by default the request id as the one id). Counts what it served."""

    def __init__(self, answer=None, streams: BrokerStreams | None = None, with_stream: bool = True) -> None:
        self.answer = answer or (lambda request: pb.ProduceReply(ids=[int(request.request_id)]))
        self.streams = streams or BrokerStreams(limit=16)
        self.unary_calls = 0
        self.stream_requests = 0
        methods = {"Produce": grpc.unary_unary_rpc_method_handler(
            self._unary, request_deserializer=pb.ProduceRequest.FromString,
            response_serializer=pb.ProduceReply.SerializeToString)}
        if with_stream:
            methods["ProduceStream"] = grpc.stream_stream_rpc_method_handler(
                self._stream, request_deserializer=pb.ProduceRequest.FromString,
                response_serializer=pb.ProduceReply.SerializeToString)
        handler = grpc.method_handlers_generic_handler("tidemq.v1.Broker", methods)
        self.server = grpc.server(futures.ThreadPoolExecutor(32), handlers=[handler])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _unary(self, request, context):
        self.unary_calls += 1
        return self.answer(request)

    def _produce(self, request, timeout):
        self.stream_requests += 1
        return self.answer(request)

    def _stream(self, requests, context):
        return self.streams.serve(requests, context, self._produce)

    def open_streams(self) -> int:
        return len(self.streams._open)

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def brokers():
    started: list[FakeBroker] = []

    def start(*args, **kw) -> FakeBroker:
        broker = FakeBroker(*args, **kw)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def pool_of():
    pools: list[BrokerPool] = []

    def make(*brokers: FakeBroker, idle_seconds: float = 10.0) -> BrokerPool:
        pool = BrokerPool(tuple(b.address for b in brokers), streams=ProduceStreams(idle_seconds))
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def test_requests_share_one_open_stream_and_each_gets_its_own_reply(brokers, pool_of):
    broker = brokers()
    pool = pool_of(broker)
    for n in range(50):
        assert list(pool.call("Produce", _request(n), 5).ids) == [n]
    assert pool.streams.opened == 1 and pool.streams.sent == 50
    assert broker.stream_requests == 50 and broker.unary_calls == 0


def test_concurrent_callers_each_get_the_reply_to_their_own_request(brokers, pool_of):
    broker = brokers()
    pool = pool_of(broker)
    wrong: list[tuple[int, list[int]]] = []

    def caller(k: int) -> None:
        for n in range(k * 100, k * 100 + 40):
            ids = list(pool.call("Produce", _request(n), 5).ids)
            if ids != [n]:
                wrong.append((n, ids))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert broker.stream_requests == 320
    assert 1 <= pool.streams.opened <= 8  # one per request in flight at once, at most


def test_a_brokers_error_ends_the_stream_and_the_next_request_opens_another(brokers, pool_of):
    def answer(request):
        if request.request_id == "13":
            raise InvalidScheduleError("bad schedule")
        return pb.ProduceReply(ids=[int(request.request_id)])

    broker = brokers(answer)
    pool = pool_of(broker)
    assert list(pool.call("Produce", _request(1), 5).ids) == [1]
    with pytest.raises(InvalidScheduleError, match="bad schedule"):
        pool.call("Produce", _request(13), 5)
    assert list(pool.call("Produce", _request(2), 5).ids) == [2]
    assert pool.streams.opened == 2
    wait_until(lambda: broker.open_streams() == 1, 5, what="the failed stream to end on the broker")


def test_a_request_past_its_deadline_cancels_its_stream_and_raises_in_time(brokers, pool_of):
    release = threading.Event()

    def answer(request):
        if request.request_id == "99":
            release.wait(30)
        return pb.ProduceReply(ids=[int(request.request_id)])

    broker = brokers(answer)
    pool = pool_of(broker)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="did not finish within 0.5 s"):
        pool.call("Produce", _request(99), 0.5)
    took = time.monotonic() - started
    release.set()
    assert took < 5  # bounded by the deadline, not by the broker's 30 s
    assert list(pool.call("Produce", _request(3), 5).ids) == [3]
    assert pool.streams.opened == 2


def test_a_broker_at_its_stream_limit_gets_unary_calls(brokers, pool_of):
    gate = threading.Event()

    def answer(request):
        if request.request_id == "1":
            gate.wait(30)  # holds the only stream busy
        return pb.ProduceReply(ids=[int(request.request_id)])

    broker = brokers(answer, streams=BrokerStreams(limit=1))
    pool = pool_of(broker)
    first = threading.Thread(target=pool.call, args=("Produce", _request(1), 30))
    first.start()
    wait_until(lambda: broker.open_streams() == 1, 5, what="the first stream")
    assert list(pool.call("Produce", _request(2), 5).ids) == [2]
    assert broker.unary_calls == 1
    assert list(pool.call("Produce", _request(3), 5).ids) == [3]
    assert broker.unary_calls == 2  # the broker stays on unary calls for a while
    gate.set()
    first.join(10)
    assert broker.stream_requests == 1


def test_a_broker_without_streams_gets_unary_calls(brokers, pool_of):
    broker = brokers(with_stream=False)
    pool = pool_of(broker)
    assert [list(pool.call("Produce", _request(n), 5).ids) for n in range(3)] == [[0], [1], [2]]
    assert broker.unary_calls == 3


def test_a_stopping_broker_cancels_idle_streams_and_the_next_request_moves_to_another(brokers, pool_of):
    stopping, other = brokers(), brokers()
    pool = pool_of(stopping, other)
    for n in range(4):  # round robin: both brokers get a stream
        pool.call("Produce", _request(n), 5)
    assert stopping.open_streams() == 1
    stopping.streams.stop()
    wait_until(lambda: stopping.open_streams() == 0, 5, what="the idle stream to end")
    served = other.stream_requests
    for n in range(10, 14):
        assert list(pool.call("Produce", _request(n), 5).ids) == [n]
    assert other.stream_requests == served + 4
    assert stopping.stream_requests == 2


def test_a_stopping_broker_answers_the_request_it_is_serving_then_ends_the_stream(brokers, pool_of):
    serving, go = threading.Event(), threading.Event()

    def answer(request):
        if request.request_id == "7":
            serving.set()
            go.wait(30)
        return pb.ProduceReply(ids=[int(request.request_id)])

    broker = brokers(answer)
    pool = pool_of(broker)
    replies: list[list[int]] = []
    caller = threading.Thread(target=lambda: replies.append(list(pool.call("Produce", _request(7), 30).ids)))
    caller.start()
    assert serving.wait(10)
    broker.streams.stop()
    go.set()
    caller.join(10)
    assert replies == [[7]]
    wait_until(lambda: broker.open_streams() == 0, 5, what="the stream to end after its reply")


def test_idle_streams_are_closed(brokers, pool_of):
    broker = brokers()
    pool = pool_of(broker, idle_seconds=0.2)
    pool.call("Produce", _request(1), 5)
    assert broker.open_streams() == 1
    wait_until(lambda: broker.open_streams() == 0, 10, what="the idle stream to be closed")
    assert list(pool.call("Produce", _request(2), 5).ids) == [2]
    assert pool.streams.opened == 2


# -- the same rules in tidemq.aio ------------------------------------------------------------
def _aio_pool(*brokers: FakeBroker, idle_seconds: float = 10.0) -> AsyncBrokerPool:
    return AsyncBrokerPool(tuple(b.address for b in brokers), streams=AsyncProduceStreams(idle_seconds))


def test_aio_concurrent_callers_share_streams_and_each_gets_its_own_reply(brokers):
    broker = brokers()

    async def main():
        pool = _aio_pool(broker)
        try:
            async def caller(k):
                return [(n, list((await pool.acall("Produce", _request(n), 5)).ids))
                        for n in range(k * 100, k * 100 + 30)]

            results = await asyncio.gather(*(caller(k) for k in range(6)))
            return pool.streams, [pair for result in results for pair in result]
        finally:
            await pool.aclose()

    streams, pairs = asyncio.run(main())
    assert all(ids == [n] for n, ids in pairs) and len(pairs) == 180
    assert broker.stream_requests == 180 and broker.unary_calls == 0
    assert 1 <= streams.opened <= 6


def test_aio_deadline_error_refusal_and_a_stopping_broker(brokers):
    release = threading.Event()

    def answer(request):
        if request.request_id == "99":
            release.wait(30)
        if request.request_id == "13":
            raise InvalidScheduleError("bad schedule")
        return pb.ProduceReply(ids=[int(request.request_id)])

    slow, full, old = brokers(answer), brokers(streams=BrokerStreams(limit=0)), brokers(with_stream=False)

    async def main():
        pool = _aio_pool(slow)
        try:
            with pytest.raises(BrokerUnavailableError, match="did not finish within 0.5 s"):
                await pool.acall("Produce", _request(99), 0.5)
            release.set()
            with pytest.raises(InvalidScheduleError, match="bad schedule"):
                await pool.acall("Produce", _request(13), 5)
            assert list((await pool.acall("Produce", _request(4), 5)).ids) == [4]
            assert pool.streams.opened == 3  # each failure ended its stream
            slow.streams.stop()
            await asyncio.to_thread(wait_until, lambda: slow.open_streams() == 0, 5, 0.02, "the idle stream to end")
        finally:
            await pool.aclose()
        for refusing in (full, old):
            pool = _aio_pool(refusing)
            try:
                assert [list((await pool.acall("Produce", _request(n), 5)).ids) for n in range(3)] == [[0], [1], [2]]
            finally:
                await pool.aclose()

    asyncio.run(main())
    assert full.unary_calls == 3 and old.unary_calls == 3


def test_aio_a_stopping_brokers_idle_stream_sends_the_next_request_elsewhere(brokers):
    stopping, other = brokers(), brokers()

    async def main():
        pool = _aio_pool(stopping, other)
        try:
            for n in range(4):
                await pool.acall("Produce", _request(n), 5)
            stopping.streams.stop()
            await asyncio.to_thread(wait_until, lambda: stopping.open_streams() == 0, 5, 0.02, "the idle stream to end")
            return [list((await pool.acall("Produce", _request(n), 5)).ids) for n in range(10, 14)]
        finally:
            await pool.aclose()

    assert asyncio.run(main()) == [[10], [11], [12], [13]]
    assert stopping.stream_requests == 2 and other.stream_requests == 6


def test_aio_idle_streams_are_closed(brokers):
    broker = brokers()

    async def main():
        pool = _aio_pool(broker, idle_seconds=0.2)
        try:
            await pool.acall("Produce", _request(1), 5)
            assert broker.open_streams() == 1
            await asyncio.to_thread(wait_until, lambda: broker.open_streams() == 0, 10, 0.02,
                                    "the idle stream to close")
        finally:
            await pool.aclose()

    asyncio.run(main())
