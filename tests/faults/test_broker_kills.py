"""kill -9 brokers again and again under produce and consume load: nothing acknowledged is lost,
nothing is stored twice (a produce retried on the other broker after its commit gets its first
answer back), nothing succeeds or runs twice, failed produce calls fail with a retriable error
within their deadline, the workers stay up, and each names each dead broker once."""

from __future__ import annotations

import re
import signal

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.stack import Stack, fault_records, reruns
from tests.processes import process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
from tidemq_broker.storages import open_storage

TOPIC = "fault.brokers"


def test_repeated_broker_kills_under_load(settings, spawn, tmp_path, record_property):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="5")
    stack = Stack(spawn, tmp_path, env, brokers=0, workers=2)
    brokers = [start_broker_process(spawn, tmp_path, env, f"broker{i}") for i in range(2)]
    client = Client(settings)
    storage = open_storage(settings.db_url)
    load = ProduceLoad(client, TOPIC, timeout=10)
    killed = []
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        load.start()
        for round_ in range(4):
            victim = round_ % 2
            wait_until(lambda: len(load.acked) >= 1000 * (round_ + 1), 90, what=f"progress before kill {round_ + 1}")
            proc, address = brokers[victim]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed.append(address)
            brokers[victim] = start_broker_process(spawn, tmp_path, env, f"broker{victim}-r{round_}")
        wait_until(lambda: len(load.acked) >= 5000, 90, what="progress after the last kill")
        load.stop()
        stack.assert_alive()
        figures = f"broker kills {len(killed)}, " + check_outcome(storage, TOPIC, load.acked, log) + ", " + \
            check_calls(load, slack=3.0)
        twice = reruns(log)
        assert not twice, f"{len(twice)} messages ran twice, no worker died: {sorted(twice)[:5]}"
        for name, worker in stack.workers.items():
            for address in killed:
                said = fault_records(worker.log_path, re.escape(address))
                assert len(said) <= 2, f"{name} named dead broker {address} {len(said)} times: {said[:3]}"
        record_property("figures", figures)
        print(f"\n{figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
