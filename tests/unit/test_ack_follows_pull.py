"""A consumer's ack goes to the broker where its pull of the same topic waits: what the ack makes
due there (a workflow's next step) is handed to that pull in the ack's own transaction. Without a
pull in flight, acks spread round robin as every call does. Real gRPC servers stand in for
brokers."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc

from tests.servers import wait_until
from tidemq.client import Client
from tidemq.config import Settings
from tidemq.link import AckItem
from tidemq.rpc import tidemq_pb2 as pb


class PullBroker:
    """Answers Pull once ``free`` is set (empty), and Ack at once; counts the acks it got."""

    def __init__(self) -> None:
        self.acks = 0
        self.pulling = threading.Event()
        self.free = threading.Event()

        def pull(request, context):
            self.pulling.set()
            self.free.wait(10)
            return pb.PullReply()

        def ack(request, context):
            self.acks += 1
            return pb.AckReply(outcomes=[pb.APPLIED for _ in request.items])

        handler = grpc.method_handlers_generic_handler("tidemq.v1.Broker", {
            "Pull": grpc.unary_unary_rpc_method_handler(
                pull, request_deserializer=pb.PullRequest.FromString,
                response_serializer=pb.PullReply.SerializeToString),
            "Ack": grpc.unary_unary_rpc_method_handler(
                ack, request_deserializer=pb.AckRequest.FromString, response_serializer=pb.AckReply.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.free.set()
        self.server.stop(0)


def test_acks_go_where_the_consumers_pull_waits_and_round_robin_without_one():
    brokers = [PullBroker(), PullBroker()]
    client = Client(Settings(brokers=tuple(b.address for b in brokers), produce_path="unary"))
    item = AckItem(1, "0" * 32, True)
    try:
        pulled: list = []
        puller = threading.Thread(target=lambda: pulled.append(client.pull("t.follow", "c1", wait=5)))
        puller.start()
        assert any(b.pulling.wait(10) for b in brokers)
        waiting = next(b for b in brokers if b.pulling.is_set())
        for _ in range(6):
            client.ack("t.follow", "c1", [item])
        assert waiting.acks == 6 and sum(b.acks for b in brokers) == 6
        # Another consumer's acks, or another topic's, do not follow that pull.
        for _ in range(4):
            client.ack("t.follow", "c2", [item])
            client.ack("t.other", "c1", [item])
        other = next(b for b in brokers if b is not waiting)
        assert (waiting.acks, other.acks) == (6 + 4, 4)  # round robin: half of the 8 each
        waiting.free.set()
        puller.join(10)
        assert pulled == [[]]
        before = [b.acks for b in brokers]
        for _ in range(4):  # the pull ended: round robin again
            client.ack("t.follow", "c1", [item])
        assert [b.acks - n for b, n in zip(brokers, before)] == [2, 2]
    finally:
        client.close()
        for b in brokers:
            b.stop()


def test_the_asyncio_clients_acks_go_where_its_pull_waits_too():
    from tidemq.aio import AsyncClient

    brokers = [PullBroker(), PullBroker()]
    item = AckItem(1, "0" * 32, True)

    async def run() -> None:
        client = AsyncClient(Settings(brokers=tuple(b.address for b in brokers), produce_path="unary"))
        try:
            puller = asyncio.create_task(client.pull("t.follow", "c1", wait=5))
            # The pull reached one of the brokers (their servers' threads set the events).
            reached = await asyncio.to_thread(wait_until, lambda: any(b.pulling.is_set() for b in brokers), 10,
                                              what="the pull at a broker")
            assert reached
            waiting = next(b for b in brokers if b.pulling.is_set())
            for _ in range(6):
                await client.ack("t.follow", "c1", [item])
            assert waiting.acks == 6 and sum(b.acks for b in brokers) == 6
            for _ in range(4):  # another consumer's acks, another topic's: round robin
                await client.ack("t.follow", "c2", [item])
                await client.ack("t.other", "c1", [item])
            other = next(b for b in brokers if b is not waiting)
            assert (waiting.acks, other.acks) == (6 + 4, 4)
            waiting.free.set()
            assert await asyncio.wait_for(puller, 10) == []
            before = [b.acks for b in brokers]
            for _ in range(4):  # the pull ended: round robin again
                await client.ack("t.follow", "c1", [item])
            assert [b.acks - n for b, n in zip(brokers, before)] == [2, 2]
        finally:
            await client.close()

    try:
        asyncio.run(run())
    finally:
        for b in brokers:
            b.stop()
