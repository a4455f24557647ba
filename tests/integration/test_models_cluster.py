"""The broker cluster on a 3-node ZooKeeper ensemble and real MariaDB: killing the ZooKeeper
leader and the maintenance-leader broker (-9) under produce and consume load loses no message
and records no success twice; another broker takes over maintenance; a consumer whose ZooKeeper
connection is suspended goes on consuming its last known share until it is back."""

from __future__ import annotations

import threading
import time


from tests.integration.handlers_common import read_log
from tests.observe import all_messages, count
from tests.processes import kill9, start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinator import ConnectionState
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator
from tidemq.message import MessageType
from tidemq import trace



def test_killing_the_zookeeper_leader_and_a_broker_loses_and_duplicates_nothing(
        mysql_url, ensemble, ensemble_chroot, spawn, tmp_path, mysql_store):
    topic = "it.cluster"
    hosts = ensemble.hosts + ensemble_chroot
    log = tmp_path / "handler.log"
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": hosts, "HANDLER_LOG": str(log), "HANDLER_TOPIC": topic,
           "HANDLER_TTR": "2", "HANDLER_SLEEP": "0.005"}
    brokers = dict(start_broker_process(spawn, tmp_path, env, f"broker{i}")[::-1]
                   for i in range(2))  # address -> process
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": hosts}))
    ids: list[int] = []
    errors: list[Exception] = []
    gaps: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        last = time.monotonic()
        while not stop.is_set():
            try:
                ids.append(client.produce(topic, len(ids)))
            except Exception as exc:  # any produce that does not return is a lost message
                errors.append(exc)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    producer = threading.Thread(target=produce)
    try:
        wait_until(lambda: sorted(client.pool.addresses()) == sorted(brokers), 30, what="both brokers discovered")
        for i in range(2):
            start_worker(spawn, f"w{i}", "tests.integration.handlers_queue", env)
        wait_registered(client.coordinator, topic, 2)
        leader = wait_until(client.coordinator.leader, 30, what="a maintenance leader")
        producer.start()
        wait_until(lambda: len(read_log(log)) >= 200, 60, what="consuming under load")

        ensemble.leader().kill()
        done = len(ids)
        wait_until(lambda: len(ids) >= done + 200, 60, what="producing after the ZooKeeper leader died")
        consumed = len(read_log(log))
        wait_until(lambda: len(read_log(log)) >= consumed + 200, 60, what="consuming after the ZooKeeper leader died")

        kill9(brokers[leader])  # the maintenance leader: the other broker must take over its jobs
        done = len(ids)
        wait_until(lambda: len(ids) >= done + 200, 60, what="producing after a broker died")
        survivor = next(a for a in brokers if a != leader)
        wait_until(lambda: client.coordinator.leader() == survivor, 60, 0.1, "the surviving broker leads")
        stop.set()
        producer.join(30)
        wait_until(lambda: count(mysql_store, topic, "SUCCESS") >= len(ids) and not count(mysql_store, topic, "NEW")
                   and not count(mysql_store, topic, "RUNNING"), 90, 0.2, "every produced message SUCCESS")
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(30)
        client.close()

    assert errors == []
    by_id = {m.id: m for m in all_messages(mysql_store, topic)}
    assert set(ids) <= set(by_id), "a produce returned an id that is not stored"
    for m in by_id.values():
        assert m.status == "SUCCESS"
        assert [e["event"] for e in trace.parse(m.trace)].count("SUCCESS") == 1, m.trace
    print(f"produced {len(ids)} with two kills; longest gap between produce returns {max(gaps):.3f} s")


def test_a_suspended_consumer_goes_on_consuming_its_last_known_share(
        mysql_url, ensemble, ensemble_chroot, spawn, tmp_path, mysql_store):
    topic = "it.suspend"
    hosts = ensemble.hosts + ensemble_chroot
    start_broker_process(spawn, tmp_path, {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": hosts}, "broker")
    leader = ensemble.leader()
    follower = next(m for m in ensemble.members if m is not leader)
    # The consumer talks to one follower only, so killing it suspends the session (which lives
    # on in the ensemble) until the follower is back.
    coordinator = ZooKeeperCoordinator(follower.hosts + ensemble_chroot, session_timeout=30.0)
    states: list[ConnectionState] = []
    coordinator.add_state_listener(states.append)
    coordinator.start()
    consumer = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": hosts}), coordinator=coordinator)
    producer = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": hosts}))
    ran: list[int] = []
    worker = Worker([ConsumerSpec(topic, MessageType.QUEUE, lambda m: ran.append(m.id), threads=2, ttr=5.0, batch=4)],
                    client=consumer, instance="suspended").start()
    try:
        wait_until(lambda: producer.pool.addresses(), 30, what="broker discovered")
        first = producer.produce_many(topic, list(range(10)))
        wait_until(lambda: len(ran) == 10, 30, what="consuming while connected")
        session = coordinator.session_id()

        follower.kill()
        wait_until(lambda: ConnectionState.SUSPENDED in states, 30, what="SUSPENDED reported")
        held = producer.produce_many(topic, list(range(20)))
        # Brokers and the database need no ZooKeeper: the consumer keeps its last rank and total.
        wait_until(lambda: count(mysql_store, topic, "SUCCESS") == 30, 30, what="consumed while suspended")
        assert states[-1] is ConnectionState.SUSPENDED

        follower.start()
        wait_until(lambda: states[-1] is ConnectionState.CONNECTED, 60, 0.1, "reconnected")
        assert coordinator.session_id() == session and ConnectionState.LOST not in states
        later = producer.produce_many(topic, list(range(5)))
        wait_until(lambda: count(mysql_store, topic, "SUCCESS") == 35, 30, what="consumed after reconnecting")
        assert sorted(ran) == sorted(first + held + later)
    finally:
        worker.stop()
        consumer.close()
        coordinator.stop()
        producer.close()
