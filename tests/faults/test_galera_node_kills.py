"""kill -9 Galera nodes under produce and consume load, then start them again: brokers move to
another node, nothing acknowledged is lost, nothing is stored twice (a produce whose commit
outcome was lost with the node is retried with its request id), nothing succeeds twice."""

from __future__ import annotations

import collections
import json
import threading

from tests.observe import all_messages, handler_runs, success_records
from tests.processes import TIDEMQ, start_broker_process
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq.errors import TidemqError
from tidemq_broker.storages import open_storage

TOPIC = "fault.galera"


def test_killing_the_node_a_broker_writes_through_loses_and_duplicates_nothing(
        galera, galera_url, zk_hosts, spawn, tmp_path, record_property):
    log = tmp_path / "runs.log"
    orders = ([0, 1, 2], [1, 2, 0])  # one broker writes through node 0, the other through node 1
    brokers = []
    for i, order in enumerate(orders):
        env = {"TIDEMQ_DB_URL": galera_url.replace(galera.addresses(), galera.addresses(order)),
               "TIDEMQ_ZK_HOSTS": zk_hosts, "FAULT_LOG": str(log), "FAULT_TOPIC": TOPIC, "FAULT_TTR": "5"}
        brokers.append(start_broker_process(spawn, tmp_path, env, f"broker{i}"))
        spawn(f"worker{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(Settings.from_env({}, zk_hosts=zk_hosts))
    storage = open_storage(galera_url.replace(galera.addresses(), galera.addresses([2, 0, 1])))
    acked: list[int] = []
    failed_calls = [0]
    stop = threading.Event()

    def produce_loop():
        n = 0
        while not stop.is_set():
            try:
                acked.extend(client.produce_many(TOPIC, [{"n": n + i} for i in range(50)], timeout=15))
            except TidemqError:
                failed_calls[0] += 1  # not acknowledged: allowed to be lost, never counted as sent
            n += 50

    producer = threading.Thread(target=produce_loop)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        producer.start()
        for round_, victim in enumerate((0, 1)):
            wait_until(lambda: len(acked) >= 1500 * (round_ + 1), 120, 0.1, f"progress before killing node {victim}")
            galera.kill(victim)
            done = len(acked)
            wait_until(lambda: len(acked) >= done + 1000, 120, 0.1, f"progress while node {victim} is down")
            galera.start_node(victim)
        done = len(acked)
        wait_until(lambda: len(acked) >= done + 500, 120, 0.1, "progress after the restarts")
        stop.set()
        producer.join(60)

        def settled():
            counts = storage.count_by_status(TOPIC).get(TOPIC, {})
            return counts.get("SUCCESS", 0) >= len(set(acked)) and not counts.get("NEW") and not counts.get("RUNNING")

        wait_until(settled, 180, 0.2, "every acknowledged message to succeed")
        messages = {m.id: m for m in all_messages(storage, TOPIC)}
        lost = set(acked) - set(messages)
        twice = [i for i, m in messages.items() if success_records(m) > 1]
        copies = collections.Counter(json.loads(m.data)["n"] for m in messages.values())
        stored_twice = sorted(n for n, k in copies.items() if k > 1)
        runs = handler_runs(log)
        reruns = sum(n - 1 for n in runs.values() if n > 1)
        figures = (f"node kills 2, acked {len(acked)}, stored {len(messages)}, lost {len(lost)}, "
                   f"stored twice {len(stored_twice)}, two SUCCESS records {len(twice)}, handler re-runs {reruns}, "
                   f"failed produce calls {failed_calls[0]}")
        record_property("figures", figures)
        print(f"\nGalera {figures}")
        assert not lost, f"{len(lost)} acknowledged messages lost"
        assert not stored_twice, f"messages stored twice: {stored_twice[:5]}"
        assert not twice, f"messages with two SUCCESS records: {twice[:5]}"
        assert all(m.status == "SUCCESS" for m in messages.values())
        assert set(runs) >= set(acked)
    finally:
        stop.set()
        client.close()
        storage.close()
