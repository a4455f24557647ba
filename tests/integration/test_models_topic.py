"""TOPIC broadcast against a real ZooKeeper: a burst reaches every online worker process once and
in order; oversized data is refused before anything is written; a consumer keeps its place
through a lost session; the maintenance leader prunes old broadcasts."""

from __future__ import annotations

import json
import threading

import pytest

from tests.integration.handlers_common import read_log
from tests.processes import start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, DataTooLargeError, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinators.zookeeper import ZooKeeperCoordinator
from tidemq.message import MessageType
from tidemq_broker.maintenance import Maintainer
from tidemq_broker.maintenance.broadcasts import BroadcastPruner

TOPIC = "it.topic"


def test_a_burst_of_500_reaches_each_of_three_workers_once_in_order(zk_hosts, spawn, tmp_path):
    log = tmp_path / "handler.log"
    env = {"TIDEMQ_ZK_HOSTS": zk_hosts, "TIDEMQ_BROKERS": "127.0.0.1:1", "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": TOPIC}
    workers = [start_worker(spawn, f"w{i}", "tests.integration.handlers_topic", env) for i in range(3)]
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    try:
        wait_registered(client.coordinator, TOPIC, 3)
        sent: dict[int, int] = {}
        lock = threading.Lock()

        def send(start: int) -> None:  # four senders at once: as fast as ZooKeeper takes them
            for i in range(start, 500, 4):
                seq = client.broadcast(TOPIC, i)
                with lock:
                    sent[seq] = i

        senders = [threading.Thread(target=send, args=(k,)) for k in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        assert len(sent) == 500
        wait_until(lambda: len(read_log(log)) >= 1500, 60, 0.1, "every worker ran the burst")
    finally:
        client.close()
    entries = read_log(log)
    assert len(entries) == 1500
    expected = [(seq, sent[seq]) for seq in sorted(sent)]
    for proc in workers:
        got = [(e.id, json.loads(e.extra)) for e in entries if e.pid == proc.pid]
        assert got == expected, f"worker {proc.pid}: {len(got)} runs, first difference at " \
            f"{next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), 500))}"


def test_oversized_broadcast_is_refused_before_anything_is_written(zk_hosts):
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    try:
        client.broadcast(TOPIC, "small")
        before = client.coordinator.broadcast_sequences(TOPIC)
        with pytest.raises(DataTooLargeError, match="1000000"):
            client.broadcast(TOPIC, "x" * 1_100_000)
        assert client.coordinator.broadcast_sequences(TOPIC) == before
    finally:
        client.close()


def test_a_consumer_keeps_its_place_through_a_lost_session(zk_hosts):
    got: list[int] = []
    settings = Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts, "TIDEMQ_BROKERS": "127.0.0.1:1"})
    coordinator = ZooKeeperCoordinator(zk_hosts, settings.zk_root, session_timeout=4.0)
    coordinator.start()
    client = Client(settings, coordinator=coordinator)
    sender = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    worker = Worker([ConsumerSpec(TOPIC, MessageType.TOPIC, lambda m: got.append(m.data))], client=client,
                    instance="keeper").start()
    try:
        wait_registered(sender.coordinator, TOPIC, 1)
        for i in range(100):
            sender.broadcast(TOPIC, i)
        coordinator.expire_session()  # mid-burst: the node goes and comes back, the cursor stays
        for i in range(100, 200):
            sender.broadcast(TOPIC, i)
        wait_until(lambda: len(got) >= 200, 30, what="all 200 run")
        wait_until(lambda: len(sender.coordinator.consumers(TOPIC)) == 1 and
                   sender.coordinator.consumers(TOPIC)[0] == worker.runners[0].registration.node, 15,
                   what="registered again")
        assert got == list(range(200))
    finally:
        worker.stop()
        coordinator.stop()
        sender.close()


def test_the_maintenance_leader_prunes_old_broadcasts(zk_hosts):
    coordinators = [ZooKeeperCoordinator(zk_hosts, "/tidemq") for _ in range(2)]
    for c in coordinators:
        c.start()
    maintainers = [Maintainer(c, f"b{i}", [BroadcastPruner(c, retention=0.3, interval=0.1)], tick=0.05)
                   for i, c in enumerate(coordinators)]
    try:
        for m in maintainers:
            m.start()
        leader = wait_until(lambda: next((m for m in maintainers if m.is_leader.is_set()), None), 15, what="a leader")
        assert sum(m.is_leader.is_set() for m in maintainers) == 1
        seqs = [coordinators[0].broadcast(TOPIC, b"{}") for _ in range(5)]
        wait_until(lambda: coordinators[0].broadcast_sequences(TOPIC) == [], 15, what="old broadcasts pruned")
        leader.stop()  # the other takes over and keeps pruning
        follower = maintainers[1 - maintainers.index(leader)]
        wait_until(follower.is_leader.is_set, 15, what="the other broker leads")
        newer = coordinators[0].broadcast(TOPIC, b"{}")
        assert newer > seqs[-1]
        wait_until(lambda: coordinators[0].broadcast_sequences(TOPIC) == [], 15, what="pruned by the new leader")
    finally:
        for m in maintainers:
            m.stop()
        for c in coordinators:
            c.stop()
