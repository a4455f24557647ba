"""Hand-offs against real MariaDB and ZooKeeper, a real broker and a real worker process: an
idle worker's pull is handed what each produce commits (and each chain step its ack releases),
and every message runs once."""

from __future__ import annotations

import json
from collections import Counter

import prometheus_client
import pytest

from tests.processes import process_env, start_worker, wait_registered
from tidemq import Client, Settings, chain, sig
from tidemq_broker.server import BrokerServer

MODULE = "tests.integration.handlers_results"
TOPIC = "results.sync"


def _handed() -> float:
    # The broker runs in this process: its metrics are this registry's.
    return prometheus_client.REGISTRY.get_sample_value("tidemq_messages_handed_off_total", {"topic": TOPIC}) or 0.0


@pytest.fixture
def broker(settings):
    server = BrokerServer(settings).start()
    yield server
    server.stop(grace=1)


def test_an_idle_workers_pull_is_handed_each_message_and_each_runs_once(settings, broker, spawn, tmp_path):
    log = tmp_path / "starts.log"
    start_worker(spawn, "w1", MODULE, process_env(settings, RESULTS_LOG=str(log), RESULTS_TTR="30",
                                                    TIDEMQ_BROKERS=broker.address))
    client = Client(Settings.from_env({}, brokers=broker.address, zk_hosts=settings.zk_hosts))
    try:
        wait_registered(client.coordinator, TOPIC, 1)
        before = _handed()
        for n in range(30):  # one at a time: the worker's pull waits between them
            assert client.produce(TOPIC, {"kind": "value", "v": n}, result=True).result(timeout=60)["echo"] == n
            first, second = chain(sig(TOPIC, {"kind": "value", "v": 1000 + n}),
                                  sig(TOPIC, {"kind": "value", "v": 2000 + n})).produce(client, result=True)
            assert second.result(timeout=60)["echo"] == 2000 + n
        handed = _handed() - before
        assert handed > 0  # through the real stack, not only in unit tests
        runs = Counter(int(line.split()[0]) for line in log.read_text().splitlines() if line)
        assert len(runs) == 90 and set(runs.values()) == {1}  # every message once
        # A handed message's lease is the worker's own: its trace reads as after a lock.
        leased = [m for m in (broker.storage.reads.get_message(id) for id in runs) if "consumer=" in m.trace]
        assert all(m.status == "SUCCESS" and json.loads(m.result)["pid"] for m in leased) and len(leased) == 90
    finally:
        client.close()
