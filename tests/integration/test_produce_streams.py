"""Produce streams on real brokers and MariaDB: producers keep producing while a broker they
hold streams to stops and a process of another is killed; every call gets its ids, each id
is stored once, and the graceful stop does not wait out its grace for streams merely open."""

from __future__ import annotations

import threading
import time

from tests.observe import all_messages
from tests.processes import kill9, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq_broker.server import BrokerServer
from tidemq_broker.storages import open_storage


def test_producers_on_streams_lose_nothing_when_brokers_stop_and_die(settings, spawn, tmp_path):
    topic = "streams.failover"
    stopping = BrokerServer(settings).start()
    killed, killed_address = start_broker_process(spawn, tmp_path, process_env(settings), "killed")
    survivor = BrokerServer(settings).start()
    client = Client(Settings.from_env({}, brokers=",".join((stopping.address, killed_address, survivor.address)),
                                      rpc_timeout=20))
    produced: list[int] = []
    errors: list[BaseException] = []
    halt = threading.Event()

    def producer(k: int) -> None:
        n = 0
        while not halt.is_set():
            try:
                produced.extend(client.produce_many(topic, [{"k": k, "n": n + i} for i in range(3)]))
            except BaseException as exc:  # noqa: BLE001 (any failure is the test's finding)
                errors.append(exc)
                return
            n += 3

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(produced) > 300, 30, what="producers to get going")
        assert client.pool.streams.sent > 0  # the calls went on streams
        began = time.monotonic()
        stopping.stop(grace=30)
        stop_took = time.monotonic() - began
        at_stop = len(produced)
        wait_until(lambda: len(produced) > at_stop + 300, 30, what="producing to go on after the stop")
        kill9(killed)
        at_kill = len(produced)
        wait_until(lambda: len(produced) > at_kill + 300, 30, what="producing to go on after the kill")
    finally:
        halt.set()
        for t in threads:
            t.join(30)
        client.close()
        survivor.stop(grace=1)
    assert errors == []
    assert stop_took < 15, f"the stop took {stop_took:.1f} s of its 30 s grace"
    assert len(set(produced)) == len(produced)
    storage = open_storage(settings.db_url)
    try:
        stored = [m.id for m in all_messages(storage, topic)]
    finally:
        storage.close()
    assert sorted(stored) == sorted(produced)
