"""kill -9 Galera nodes under produce and consume load, then start them again: brokers move to
another node, nothing acknowledged is lost, nothing is stored twice (a produce whose commit
outcome was lost with the node is retried with its request id), nothing succeeds twice.

The test is about tidemq, not Galera's quorum: survivors that form no primary component of
their own are bootstrapped, as an operator would, and the figures say how often."""

from __future__ import annotations

from tests.faults.load import ProduceLoad, check_outcome
from tests.processes import TIDEMQ, start_broker_process
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq_broker.storages import open_storage

TOPIC = "fault.galera"


def test_killing_the_node_a_broker_writes_through_loses_and_duplicates_nothing(
        galera, galera_url, zk_hosts, spawn, tmp_path, record_property):
    log = tmp_path / "runs.log"
    orders = ([0, 1, 2], [1, 2, 0])  # one broker writes through node 0, the other through node 1
    for i, order in enumerate(orders):
        env = {"TIDEMQ_DB_URL": galera_url.replace(galera.addresses(), galera.addresses(order)),
               "TIDEMQ_ZK_HOSTS": zk_hosts, "FAULT_LOG": str(log), "FAULT_TOPIC": TOPIC, "FAULT_TTR": "5"}
        start_broker_process(spawn, tmp_path, env, f"broker{i}")
        spawn(f"worker{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(Settings.from_env({}, zk_hosts=zk_hosts))
    storage = open_storage(galera_url.replace(galera.addresses(), galera.addresses([2, 0, 1])))
    load = ProduceLoad(client, TOPIC, timeout=15)
    bootstraps = 0  # survivors that formed no primary component by themselves (see wait_primary)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        load.start()
        for round_, victim in enumerate((0, 1)):
            wait_until(lambda: len(load.acked) >= 1500 * (round_ + 1), 120, 0.1,
                       f"progress before killing node {victim}")
            galera.kill(victim)
            done = len(load.acked)
            bootstraps += galera.wait_primary()
            wait_until(lambda: len(load.acked) >= done + 1000, 120, 0.1, f"progress while node {victim} is down")
            galera.start_node(victim)
        done = len(load.acked)
        wait_until(lambda: len(load.acked) >= done + 500, 120, 0.1, "progress after the restarts")
        load.stop()
        figures = "Galera node kills 2, " + check_outcome(storage, TOPIC, load.acked, log) + \
            f", failed produce calls {load.failed}, survivors bootstrapped by hand {bootstraps}"
        record_property("figures", figures)
        print(f"\n{figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
