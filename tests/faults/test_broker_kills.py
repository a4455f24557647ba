"""kill -9 brokers again and again under produce and consume load: nothing acknowledged is lost,
nothing is stored twice (a produce retried on the other broker after its commit gets its first
answer back), nothing succeeds twice."""

from __future__ import annotations

import collections
import json
import signal
import threading

from tests.observe import all_messages, handler_runs, success_records
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
from tidemq.errors import TidemqError
from tidemq_broker.storages import open_storage

TOPIC = "fault.brokers"


def test_repeated_broker_kills_under_load(settings, spawn, tmp_path, record_property):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="5")
    brokers = [start_broker_process(spawn, tmp_path, env, f"broker{i}") for i in range(2)]
    for i in range(2):
        spawn(f"worker{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(settings)
    storage = open_storage(settings.db_url)
    acked: list[int] = []
    failed_calls = [0]
    stop = threading.Event()

    def produce_loop():
        n = 0
        while not stop.is_set():
            try:
                acked.extend(client.produce_many(TOPIC, [{"n": n + i} for i in range(50)], timeout=10))
            except TidemqError:
                failed_calls[0] += 1  # not acknowledged: allowed to be lost, never counted as sent
            n += 50

    producer = threading.Thread(target=produce_loop)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        producer.start()
        kills = 0
        for round_ in range(4):
            victim = round_ % 2
            wait_until(lambda: len(acked) >= 1000 * (round_ + 1), 90, what=f"progress before kill {round_ + 1}")
            proc, _ = brokers[victim]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            brokers[victim] = start_broker_process(spawn, tmp_path, env, f"broker{victim}-r{round_}")
        wait_until(lambda: len(acked) >= 5000, 90, what="progress after the last kill")
        stop.set()
        producer.join(30)

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
        record_property("figures", f"kills={kills} acked={len(acked)} stored={len(messages)} lost={len(lost)} "
                                   f"stored_twice={len(stored_twice)} double_success={len(twice)} "
                                   f"handler_reruns={reruns} failed_calls={failed_calls[0]}")
        print(f"\nbroker kills: {kills}, acked {len(acked)}, stored {len(messages)}, lost {len(lost)}, "
              f"stored twice {len(stored_twice)}, "
              f"two SUCCESS records {len(twice)}, handler re-runs {reruns}, failed produce calls {failed_calls[0]}")
        assert not lost, f"{len(lost)} acknowledged messages lost"
        assert not stored_twice, f"messages stored twice: {stored_twice[:5]}"
        assert not twice, f"messages with two SUCCESS records: {twice[:5]}"
        assert all(m.status == "SUCCESS" for m in messages.values())
        assert set(runs) >= set(acked)
    finally:
        stop.set()
        client.close()
        storage.close()
