"""TIDEMQ_PRODUCE=direct on real MariaDB: a Python producer commits its messages itself, with
the brokers' checks, group commit, unique keys, priorities and traces, and a broker found
through ZooKeeper delivers them to a consumer long-polling through it."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from tests.background import InThread
from tests.servers import wait_until
from tidemq import BatchConsumer, Client
from tidemq.errors import ConfigurationError, DataTooLargeError, InvalidTopicError
from tidemq.aio import AsyncClient


@pytest.fixture
def direct(settings, broker):
    """A client that commits what it produces itself; the broker serves everything else."""
    c = Client(replace(settings, produce_path="direct"))
    yield c
    c.close()


def test_a_direct_message_reaches_a_consumer_waiting_on_a_broker(direct, client, broker):
    consumer = BatchConsumer("direct.wait", client=client)
    pull = InThread(lambda: consumer.pull(max_messages=1, wait=30.0))
    wait_until(lambda: broker.hub._waiters.get("direct.wait"), 10, what="the pull to wait")
    msg_id = direct.produce("direct.wait", {"n": 1})
    committed = time.monotonic()
    [got] = pull.value(30)
    # The broker's insert watch finds rows committed by others every 20 ms while a pull waits:
    # a functional bound, far from a timing promise (without it the pull waits out its 30 s).
    assert got.id == msg_id and got.data == {"n": 1} and time.monotonic() - committed < 5.0
    assert consumer.ack(succeeded=[got.id])
    stored = broker.storage.reads.get_message(msg_id)
    assert stored.status == "SUCCESS"
    assert "direct:" in stored.trace.splitlines()[0]  # produced by this process, not a broker


def test_direct_keeps_unique_keys_priorities_delays_and_retries(direct, client, broker):
    first = direct.produce("direct.keys", {"v": 1}, unique_key="order-7", retry=["1s", "2m"], priority=7)
    again = direct.produce("direct.keys", {"v": 2}, unique_key="order-7")
    assert again == first
    later = direct.produce("direct.keys", {"v": 3}, delay=3600)
    row = broker.storage.reads.get_message(first)
    assert (row.priority, row.retry_schedule, row.data) == (7, [1.0, 120.0], '{"v":1}')
    assert broker.storage.reads.get_message(later).effect_time > row.effect_time
    [got] = BatchConsumer("direct.keys", client=client).pull(max_messages=10, wait=5.0)
    assert got.id == first  # the delayed one is not due


def test_bad_input_is_refused_with_the_brokers_errors_and_nothing_of_the_call_is_stored(direct, broker):
    big = "x" * (direct.settings.max_data_bytes + 1)
    with pytest.raises(DataTooLargeError, match=str(direct.settings.max_data_bytes)):
        direct.produce_many("direct.bad", [{"ok": 1}, big])
    with pytest.raises(InvalidTopicError):
        direct.produce("bad topic!", {})
    assert broker.storage.counts.count_by_status("direct.bad") == {}  # the good first row neither
    ok = direct.produce("direct.bad", {"ok": 2})
    assert broker.storage.counts.count_by_status("direct.bad") == {"direct.bad": {"NEW": 1}}
    assert broker.storage.reads.get_message(ok).status == "NEW"


def test_concurrent_direct_produces_share_commits_and_each_gets_its_own_ids(direct, broker):
    ids: list[int] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        got = [direct.produce("direct.many", {"t": n, "k": k}) for k in range(25)]
        with lock:
            ids.extend(got)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(ids) == len(set(ids)) == 400
    assert all(broker.storage.reads.get_message(i).topic == "direct.many" for i in ids)
    # What overlapped was committed together.
    assert direct._direct.writer.commits < direct.producer.requests == 400


def test_a_direct_commit_carries_no_request_id(direct, broker):
    # A request id lets a broker answer a retry on another broker; nothing retries a direct
    # commit and it stores none, so the client does not make one for it.
    seen = []
    original = direct._direct.produce

    def spy(request, timeout):
        seen.append(request.request_id)
        return original(request, timeout)

    direct._direct.produce = spy
    one = direct.produce("direct.unnamed", 1)
    two = direct.produce_many("direct.unnamed", [2, 3])
    assert seen == ["", ""]
    assert [broker.storage.reads.get_message(i).data for i in [one, *two]] == ["1", "2", "3"]


def test_the_async_client_commits_directly_too(settings, broker):
    import asyncio

    async def run() -> list[int]:
        async with AsyncClient(replace(settings, produce_path="direct")) as aclient:
            # As the threaded client: twice the producer's commits in flight, one group ready.
            assert aclient.producer._slots == 2 * settings.produce_in_flight
            return await asyncio.gather(*(aclient.produce("direct.aio", {"n": n}) for n in range(20)))

    ids = asyncio.run(run())
    assert len(set(ids)) == 20 and all(broker.storage.reads.get_message(i) for i in ids)


def test_an_unknown_produce_path_is_refused_naming_the_choices():
    from tidemq import Settings

    with pytest.raises(ConfigurationError, match="TIDEMQ_PRODUCE must be one of broker, unary, direct, got 'grpc'"):
        Settings.from_env({"TIDEMQ_PRODUCE": "grpc"})
