"""kill -9 brokers again and again under produce and consume load: nothing acknowledged is lost,
nothing is stored twice (a produce retried on the other broker after its commit gets its first
answer back), nothing succeeds twice."""

from __future__ import annotations

import signal

from tests.faults.load import ProduceLoad, check_outcome
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
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
    load = ProduceLoad(client, TOPIC, timeout=10)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        load.start()
        kills = 0
        for round_ in range(4):
            victim = round_ % 2
            wait_until(lambda: len(load.acked) >= 1000 * (round_ + 1), 90, what=f"progress before kill {round_ + 1}")
            proc, _ = brokers[victim]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            brokers[victim] = start_broker_process(spawn, tmp_path, env, f"broker{victim}-r{round_}")
        wait_until(lambda: len(load.acked) >= 5000, 90, what="progress after the last kill")
        load.stop()
        figures = f"broker kills {kills}, " + check_outcome(storage, TOPIC, load.acked, log) + \
            f", failed produce calls {load.failed}"
        record_property("figures", figures)
        print(f"\n{figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
