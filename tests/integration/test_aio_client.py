"""tidemq.aio against a real broker on MariaDB, found through ZooKeeper: produce, produce_many,
cancel, requeue and BatchConsumer as coroutines, with the synchronous client's checks and errors."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import grpc
import grpc.aio
import pytest

from tests.observe import count
from tests.servers import wait_until
from tidemq import Settings
from tidemq.aio import AsyncClient, BatchConsumer
from tidemq.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    DataTooLargeError,
    InvalidDataError,
    InvalidDelayError,
    InvalidTopicError,
    MalformedRequestError,
)
from tidemq.lifecycle import MessageStatus
from tidemq.rpc import tidemq_pb2 as pb
from tidemq_broker.server import BrokerServer

pytestmark = pytest.mark.asyncio
NEW, SUCCESS, FAIL = MessageStatus.NEW.value, MessageStatus.SUCCESS.value, MessageStatus.FAIL.value


async def discovered(settings: Settings, *brokers: BrokerServer) -> AsyncClient:
    client = AsyncClient(settings)
    wanted = {b.address for b in brokers}
    wait_until(lambda: wanted <= set(client.pool.addresses()), 10, what="broker discovery")
    return client


async def test_produce_stores_and_returns_ids_that_the_batch_consumer_then_leases(settings, broker):
    async with await discovered(settings, broker) as client:
        one = await client.produce("t.aio", {"n": 0}, retry=0)
        many = await client.produce_many("t.aio", [{"n": n} for n in range(1, 5)], retry=0)
        keyed = await client.produce("t.aio", {"n": 9}, unique_key="k-1", retry=0)
        assert await client.produce("t.aio", {"n": 10}, unique_key="k-1") == keyed  # stored once
        assert len({one, *many, keyed}) == 6
        assert count(broker.storage, "t.aio", NEW) == 6
        consumer = BatchConsumer("t.aio", ttr=30, client=client, name="batch-aio")
        batch = await consumer.pull(max_messages=10, wait=5)
        assert sorted(m.id for m in batch) == sorted([one, *many, keyed])
        assert {m.data["n"] for m in batch} == {0, 1, 2, 3, 4, 9}
        assert await consumer.touch(batch[0], 60) is True
        result = await consumer.ack(succeeded=[m.id for m in batch[:4]], failed={m.id: "bad" for m in batch[4:]})
        assert sorted(result.applied) == sorted(m.id for m in batch) and result.stale == []
        assert count(broker.storage, "t.aio", SUCCESS) == 4 and count(broker.storage, "t.aio", FAIL) == 2
        with pytest.raises(MalformedRequestError, match="was not pulled by this consumer"):
            await consumer.ack(succeeded=[batch[0].id])  # acknowledged already
        with pytest.raises(ConfigurationError, match="await consumer.touch"):
            batch[0].touch()


async def test_key_and_priority_reach_the_stored_rows(settings, broker):
    async with await discovered(settings, broker) as client:
        urgent = await client.produce("t.aio.flow", {"n": 1}, key="customer-7", priority=8)
        pair = await client.produce_many("t.aio.flow", [{"n": 2}, {"n": 3}], keys=["a", None], priority=3)
        with pytest.raises(MalformedRequestError, match="from 0 to 9"):
            await client.produce("t.aio.flow", {}, priority=12)
        with pytest.raises(ConfigurationError, match="keys has 1 entries for 2 messages"):
            await client.produce_many("t.aio.flow", [1, 2], keys=["a"])
        rows = {i: broker.storage.reads.get_message(i) for i in (urgent, *pair)}
        assert (rows[urgent].priority, rows[urgent].flow_key) == (8, "customer-7")
        assert [(rows[i].priority, rows[i].flow_key) for i in pair] == [(3, "a"), (3, None)]


async def test_delay_and_effect_time_hold_a_message_back(settings, broker):
    async with await discovered(settings, broker) as client:
        later = await client.produce("t.aio.delay", {"x": 1}, delay=3600)
        consumer = BatchConsumer("t.aio.delay", client=client)
        assert await consumer.pull(wait=0.2) == []
        stored = broker.storage.reads.get_message(later)
        assert stored is not None and stored.status == NEW


async def test_cancel_deletes_only_pending_messages(settings, broker):
    async with await discovered(settings, broker) as client:
        pending, leased = await client.produce_many("t.aio.cancel", [1, 2])
        consumer = BatchConsumer("t.aio.cancel", client=client)
        await client.cancel(pending)  # the pull below can then lease only the other
        batch = await consumer.pull(max_messages=2, wait=5)
        assert [m.id for m in batch] == [leased]
        assert await client.cancel(leased) is False  # RUNNING: not cancelled
        assert await client.cancel(pending) is False  # gone already
        assert broker.storage.reads.get_message(pending) is None
        assert await client.cancel_many([leased, 10**12]) == [False, False]


async def test_requeue_puts_dead_letters_back_by_id_and_by_topic(settings, broker):
    async with await discovered(settings, broker) as client:
        ids = await client.produce_many("t.aio.dead", [1, 2, 3], retry=0)
        consumer = BatchConsumer("t.aio.dead", client=client)
        batch = await consumer.pull(max_messages=3, wait=5)
        await consumer.ack(failed=[m.id for m in batch])
        assert count(broker.storage, "t.aio.dead", FAIL) == 3
        assert await client.requeue([ids[0]]) == 1
        assert count(broker.storage, "t.aio.dead", NEW) == 1
        assert await client.requeue(topic="t.aio.dead", retry=2) == 2
        assert count(broker.storage, "t.aio.dead", NEW) == 3 and count(broker.storage, "t.aio.dead", FAIL) == 0


@pytest.mark.parametrize("call, error, words", [
    (lambda c: c.produce("bad topic!", {}), InvalidTopicError, "characters outside"),
    (lambda c: c.produce("t.aio.bad", {"x": float("nan")}), InvalidDataError, "not JSON compliant"),
    (lambda c: c.produce("t.aio.bad", "x" * 2_000_000), DataTooLargeError, "limit"),
    (lambda c: c.produce("t.aio.bad", {}, delay=-1), InvalidDelayError, "delay"),
    (lambda c: c.produce("t.aio.bad", {}, delay=1, effect_time=__import__("datetime").datetime.now()),
     InvalidDelayError, "not both"),
    (lambda c: c.produce_many("t.aio.bad", [1, {"x": float("inf")}]), InvalidDataError, "message #1"),
    (lambda c: c.produce_many("t.aio.bad", [1, 2], unique_keys=["a"]), ConfigurationError, "1 entries for 2"),
    (lambda c: c.produce_many("t.aio.bad", []), MalformedRequestError, "at least one"),
])
async def test_bad_input_gets_the_synchronous_client_s_error_and_stores_nothing(settings, broker, call, error, words):
    async with await discovered(settings, broker) as client:
        with pytest.raises(error, match=words):
            await call(client)
    assert broker.storage.counts.count_by_status("t.aio.bad") == {}


async def test_a_broker_s_refusal_is_raised_as_the_tidemq_error_it_named(settings, broker):
    async with await discovered(settings, broker) as client:
        # Past the client's checks: the broker's own validation answers INVALID_ARGUMENT.
        with pytest.raises(InvalidTopicError, match="characters outside"):
            await client.pool.acall("Produce", pb.ProduceRequest(messages=[pb.NewMessage(topic="bad topic!")]), 5)
        with pytest.raises(InvalidDataError):
            await client.pool.acall("Produce", pb.ProduceRequest(messages=[pb.NewMessage(topic="t.x", data="{")]), 5)


async def test_concurrent_produces_share_rpcs_and_a_bad_one_fails_alone(settings, broker):
    async with await discovered(settings, broker) as client:
        # An over-limit topic name is caught by the client before any RPC; a data string that is not
        # JSON can only be refused by the broker, which then refuses the shared RPC it travels in.
        good = [client.produce("t.aio.many", {"n": n}) for n in range(300)]
        bad_request = pb.NewMessage(topic="t.aio.many", data="{not json")
        bad = client.producer.submit([bad_request], 1, len(bad_request.data), 10)
        results = await asyncio.gather(*good, bad, return_exceptions=True)
        ids, refused = results[:-1], results[-1]
        assert isinstance(refused, InvalidDataError)
        assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 300
        assert client.producer.flushes < 300  # coalesced: fewer RPCs than calls
        assert count(broker.storage, "t.aio.many", NEW) == 300
        stored = {broker.storage.reads.get_message(i).data for i in ids[:3]}  # type: ignore[union-attr]
        assert {json.loads(d)["n"] for d in stored} == {0, 1, 2}


async def test_a_dead_broker_in_the_list_is_passed_over_and_the_call_lands_on_a_live_one(settings, broker):
    dead = "127.0.0.1:9"  # discard port: nothing listens, the connection is refused
    static = Settings.from_env({}, brokers=f"{dead},{broker.address}")
    async with AsyncClient(static) as client:
        ids = [await client.produce("t.aio.failover", n) for n in range(4)]  # round robin tries the dead one too
        assert count(broker.storage, "t.aio.failover", NEW) == 4 and len(set(ids)) == 4
    alone = Settings.from_env({}, brokers=dead, rpc_timeout=1.0)
    async with AsyncClient(alone) as client:
        with pytest.raises(BrokerUnavailableError, match="no broker answered Produce within 1.0 s"):
            await client.produce("t.aio.failover", 1)


@pytest.mark.parametrize("path", ["broker", "unary"])
async def test_a_produce_whose_answer_was_lost_is_sent_again_elsewhere_and_stored_once(settings, broker, path):
    second = BrokerServer(settings).start()
    try:
        async with await discovered(replace(settings, produce_path=path), broker, second) as client:
            real_stub = client.pool._stub
            lost: list[list[int]] = []

            def answered(reply):
                """The first answer of a Produce on the first broker is lost: the connection drops."""
                if not lost and reply is not grpc.aio.EOF:
                    lost.append(list(reply.ids))
                    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                               grpc.aio.Metadata(), "connection lost")
                return reply

            class LostStream:
                """A produce stream whose first reply is lost after the broker committed."""

                def __init__(self, call):
                    self._call = call

                async def write(self, request):
                    await self._call.write(request)

                async def read(self):
                    return answered(await self._call.read())

                def cancel(self):
                    return self._call.cancel()

            class AnswerLost:
                """The first broker commits a Produce, then the connection drops before the reply."""

                def __init__(self, stub):
                    self._stub = stub

                def __getattr__(self, name):
                    method = getattr(self._stub, name)
                    if name == "ProduceStream":
                        return lambda **options: LostStream(method(**options))

                    async def call(request, **options):
                        reply = await method(request, **options)
                        return answered(reply) if name == "Produce" else reply
                    return call

            client.pool._stub = lambda address: (  # type: ignore[method-assign]
                AnswerLost(real_stub(address)) if address == broker.address else real_stub(address))
            answers = []
            while not lost:  # round robin: sooner or later a call goes to the first broker
                answers.append(await client.produce_many("t.aio.idem", [1, 2, 3]))
            assert answers[-1] == lost[0]  # the retry on the second broker got the first answer
            assert count(broker.storage, "t.aio.idem", NEW) == 3 * len(answers)  # nothing stored twice
    finally:
        second.stop(grace=1)


async def test_module_functions_use_one_client_per_event_loop(settings, broker):
    import tidemq.aio

    tidemq.aio.configure(zk_hosts=settings.zk_hosts, zk_root=settings.zk_root)
    try:
        made = tidemq.aio.client()
        assert tidemq.aio.client() is made
        wait_until(lambda: broker.address in made.pool.addresses(), 10, what="broker discovery")
        msg_id = await tidemq.aio.produce("t.aio.module", {"a": 1})
        assert await tidemq.aio.produce_many("t.aio.module", [1, 2]) != []
        assert await tidemq.aio.cancel(msg_id) is True
        assert await tidemq.aio.requeue(topic="t.aio.module") == 0
    finally:
        await tidemq.aio.close()


async def test_tls_and_tokens_work_and_fail_as_with_the_synchronous_client(settings, tmp_path):
    from dataclasses import replace

    from tests.pki import Authority
    from tidemq import clock
    from tidemq.errors import AuthenticationError, PermissionDeniedError
    from tidemq_broker.auth import new_token, token_hash

    ca = Authority(tmp_path / "pki")
    server = ca.server()
    broker = BrokerServer(replace(settings, tls_cert=server.cert, tls_key=server.key, auth="token")).start()
    token = new_token()
    broker.storage.principals.add("aio", "producer", ("orders.*",), token_hash(token), clock.now())

    def over_tls(**fields) -> AsyncClient:
        return AsyncClient(Settings.from_env({}, brokers=broker.address, rpc_timeout=2, tls_ca=ca.ca, **fields))

    try:
        async with over_tls(token=token) as client:
            assert await client.produce("orders.aio", {"n": 1}) > 0
            with pytest.raises(PermissionDeniedError):
                await client.produce("billing.aio", {"n": 2})  # a topic this principal may not use
        async with over_tls(token=new_token()) as client:  # well formed, but nobody's
            with pytest.raises(AuthenticationError):
                await client.produce("orders.aio", {"n": 3})
        async with AsyncClient(Settings.from_env({}, brokers=broker.address, rpc_timeout=1, token=token)) as plain:
            with pytest.raises(BrokerUnavailableError, match="TIDEMQ_TLS_CA"):
                await plain.produce("orders.aio", {"n": 4})
        assert count(broker.storage, "orders.aio", NEW) == 1 and count(broker.storage, "billing.aio", NEW) == 0
    finally:
        broker.stop(grace=1)
