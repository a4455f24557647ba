"""ZooKeeper faults. A consumer's session expires, then the ensemble's leader is killed, while a
SERIAL_QUEUE topic runs: consumers re-register and never run two messages of it at once. And
ZooKeeper stops for longer than the session timeout under QUEUE load: consumption goes on."""

from __future__ import annotations

import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.serial_runs import SerialRuns
from tests.faults.stack import Stack, reruns, successes
from tests.processes import process_env
from tests.servers import ZooKeeper, wait_until
from tidemq import Client, MessageType, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq_broker.server import BrokerServer
from tidemq_broker.storages import open_storage

TOPIC = "fault.zk.serial"
TOPIC_Q = "fault.zk.queue"


def test_session_expiry_and_leader_kill_keep_serial_order_and_exclusivity(ensemble, ensemble_chroot, mysql_url):
    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=ensemble.hosts + ensemble_chroot)
    broker = BrokerServer(settings).start()
    serial = SerialRuns(sleep=0.005)
    workers, clients = [], []
    try:
        for n in range(3):
            client = Client(settings)
            clients.append(client)
            spec = ConsumerSpec(TOPIC, MessageType.SERIAL_QUEUE, serial.handler(n), threads=1, ttr=3, batch=1)
            workers.append(Worker([spec], client=client, drain_timeout=10).start())
        wait_until(lambda: len(clients[0].coordinator.consumers(TOPIC)) == 3, 30, what="three consumers")
        ids = []
        for start in range(0, 240, 40):
            ids += clients[0].produce_many(TOPIC, [{"n": n} for n in range(start, start + 40)])

        wait_until(lambda: len(serial.runs) >= 40, 60, what="serial work under way")
        top = min(workers, key=lambda w: w.runners[0].rank[0])
        old_node = top.runners[0].registration.node
        top.client.coordinator.expire_session()
        wait_until(lambda: top.runners[0].registration.node != old_node, 30, what="re-registration after expiry")
        new_rank = wait_until(lambda: top.runners[0].rank[0] >= 0 and top.runners[0].rank, 30, what="a rank again")
        assert new_rank[0] == 2, "a consumer that registers again is the newest: it must not take the top rank back"

        wait_until(lambda: len(serial.runs) >= 120, 60, what="work after the session expiry")
        ensemble.leader().kill()
        wait_until(lambda: broker.storage.counts.count_by_status(TOPIC) == {TOPIC: {"SUCCESS": len(ids)}}, 120, 0.05,
                   "every serial message to succeed")
    finally:
        for worker in workers:
            worker.stop()
        for client in clients:
            client.close()
        broker.stop(grace=1)

    serial.assert_one_at_a_time_in_order(ids)
    print(f"\nzookeeper faults: {len(ids)} serial messages, workers used {sorted({run.worker for run in serial.runs})}")


def test_zookeeper_stopped_longer_than_the_session_timeout(mysql_url, spawn, tmp_path, record_property):
    """ZooKeeper (its own server here, so stopping it touches no other test) stops under load for
    three session timeouts and starts again: workers keep consuming on their last known ranks
    and producers keep producing meanwhile, nothing is lost or run twice, no process exits, each
    names the outage once, and every process is registered again afterwards."""
    server = ZooKeeper().start()
    session = 2.0
    try:
        hosts = server.hosts + _chroot(server.hosts)
        settings = Settings.from_env({"TIDEMQ_ZK_SESSION_TIMEOUT": str(session)}, db_url=mysql_url, zk_hosts=hosts)
        log = tmp_path / "runs.log"
        env = process_env(settings, TIDEMQ_ZK_SESSION_TIMEOUT=str(session), FAULT_LOG=str(log), FAULT_TOPIC=TOPIC_Q,
                          FAULT_TTR="3", FAULT_SLEEP="0.002")
        stack = Stack(spawn, tmp_path, env, brokers=2, workers=2)
        client = Client(settings)
        load = ProduceLoad(client, TOPIC_Q, timeout=3.0, every=0.2)
        storage = open_storage(mysql_url)
        try:
            wait_until(lambda: len(client.coordinator.consumers(TOPIC_Q)) == 2, 30, what="two workers registered")
            wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="two brokers discovered")
            load.start()
            wait_until(lambda: successes(storage, TOPIC_Q) >= 500, 60, what="consumption before the outage")
            stopped_at = time.monotonic()
            server.stop()
            done = successes(storage, TOPIC_Q)
            wait_until(lambda: successes(storage, TOPIC_Q) >= done + 500, 60, 0.1,
                       "consumption while ZooKeeper is down")
            assert load.succeeded_since(stopped_at), "no produce call succeeded while ZooKeeper was down"
            time.sleep(max(0.0, stopped_at + 3 * session - time.monotonic()))  # past the session timeout
            during = successes(storage, TOPIC_Q) - done
            server.start()
            wait_until(lambda: len(_consumers(client, TOPIC_Q)) == 2, 30, what="both workers registered again")
            wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="both brokers registered again")
            done = successes(storage, TOPIC_Q)
            wait_until(lambda: successes(storage, TOPIC_Q) >= done + 500, 30, 0.1, "consumption after the restart")
            load.stop()

            stack.assert_alive()
            figures = check_calls(load) + ", " + check_outcome(storage, TOPIC_Q, load.acked, log)
            twice = reruns(log)
            assert not twice, f"{len(twice)} messages ran twice, none of their workers died: {sorted(twice)[:5]}"
            # Lost, back, and (if the session expired meanwhile) registered again: not per retry.
            named = stack.assert_fault_named_once(r"zookeeper|kazoo|session", at_most=3)
            figures += f", consumed while ZooKeeper was down {during}, records naming it: {named}"
            record_property("figures", figures)
            print(f"\nzookeeper outage: {figures}")
        finally:
            load.stop()
            client.close()
            storage.close()
    finally:
        server.cleanup()


def _chroot(hosts: str) -> str:
    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)
    zk.ensure_path(chroot)
    zk.stop()
    zk.close()
    return chroot


def _consumers(client, topic: str) -> list[str]:
    """The topic's consumers as this test's own session sees them; none while that session is
    itself being re-established after the outage (it may have expired too)."""
    try:
        return client.coordinator.consumers(topic)
    except KazooException:
        return []
