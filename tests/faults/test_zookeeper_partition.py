"""One process cut off from ZooKeeper while everything else still reaches it (a relay between
that process and the server, cut for three session timeouts, then healed).

The others see its session end and take over its share; it goes on with the assignment it
last knew, so for a while two consumers pull the same messages. The lock keeps every message to
one run, and a serial topic to one message at a time and its order; once the relay heals the
process finds its session gone and registers again as the newest consumer."""

from __future__ import annotations

import collections
import time

import pytest

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.partition import Relay
from tests.faults.serial_runs import SerialRuns
from tests.faults.stack import Stack, reruns, successes
from tests.observe import all_messages
from tests.processes import TIDEMQ, kill9, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, MessageType, Settings, Worker, trace
from tidemq.consumer import ConsumerSpec
from tidemq_broker.server import BrokerServer
from tidemq_broker.storages import open_storage

SESSION = 2.0  # seconds: ZooKeeper ends the cut-off session this long after it last heard of it


@pytest.fixture
def relay(zookeeper):
    relay = Relay(zookeeper.hosts)
    yield relay
    relay.close()


def _through(relay: Relay, zk_hosts: str) -> str:
    """``zk_hosts`` (``host:port/chroot``) with the relay in place of the server."""
    return relay.address + "/" + zk_hosts.partition("/")[2]


def _runs_by(log, pid: int, after: float, before: float = float("inf")) -> int:
    """Handler runs of process ``pid`` that started between ``after`` and ``before`` (time.time())."""
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines()
               if line.strip() and int(line.split()[1]) == pid and after <= float(line.split()[3]) < before)


def test_a_worker_cut_off_from_zookeeper_keeps_its_shard_and_nothing_runs_twice(
        mysql_url, zk_hosts, relay, spawn, tmp_path, record_property):
    topic, log = "fault.partition.queue", tmp_path / "runs.log"
    settings = Settings.from_env({"TIDEMQ_ZK_SESSION_TIMEOUT": str(SESSION)}, db_url=mysql_url, zk_hosts=zk_hosts)
    env = process_env(settings, TIDEMQ_ZK_SESSION_TIMEOUT=str(SESSION), FAULT_LOG=str(log), FAULT_TOPIC=topic,
                      FAULT_TTR="3", FAULT_SLEEP="0.002")
    stack = Stack(spawn, tmp_path, env, brokers=2, workers=1)
    cut_off = spawn("cut", TIDEMQ + ["worker", "tests.faults.handlers_faults"],
                    {**env, "TIDEMQ_ZK_HOSTS": _through(relay, zk_hosts)})
    stack.workers["cut"] = cut_off
    client = Client(settings)
    load = ProduceLoad(client, topic, timeout=3.0, every=0.2)
    storage = open_storage(mysql_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, what="two workers registered")
        wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="two brokers discovered")
        load.start()
        wait_until(lambda: _runs_by(log, cut_off.pid, 0) >= 100, 60, what="the worker to be cut off at work")

        relay.cut()
        cut_at = time.time()
        # The server ends the session; the other worker, ranked alone now, pulls every shard.
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 1, 10 * SESSION, 0.05,
                   "the cut-off worker's session to end")
        alone_at = time.time()
        done = successes(storage, topic)
        wait_until(lambda: successes(storage, topic) >= done + 500, 60, 0.1, "consumption during the partition")
        time.sleep(max(0.0, cut_at + 3 * SESSION - time.time()))  # three session timeouts cut off
        healed_at = time.time()
        kept_on = _runs_by(log, cut_off.pid, alone_at, healed_at)
        relay.heal()

        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, 0.05,
                   "the cut-off worker registered again")
        back_at = time.time()
        wait_until(lambda: _runs_by(log, cut_off.pid, back_at) >= 50, 30, 0.1,
                   "the worker that was cut off to take a share again")
        load.stop()

        stack.assert_alive()
        figures = check_calls(load) + ", " + check_outcome(storage, topic, load.acked, log)
        twice = reruns(log)
        assert not twice, f"{len(twice)} messages ran twice, no worker died: {sorted(twice)[:5]}"
        # While the other worker owned every shard, the cut-off one still ran its old shard's
        # messages: the lock, not ZooKeeper, decided which of them ran each.
        assert kept_on > 0, "the cut-off worker stopped consuming while ZooKeeper was out of its reach"
        named = stack.assert_fault_named_once(r"zookeeper|kazoo|session", at_most=3)
        assert stack.fault_records(r"zookeeper|kazoo|session")["cut"], "the cut-off worker never named the fault"
        figures += (f", session ended {alone_at - cut_at:.1f} s after the cut, runs by the cut-off worker "
                    f"while the other owned every shard {kept_on}, records naming it: {named}")
        record_property("figures", figures)
        print(f"\nzookeeper partition: {figures}")
    finally:
        load.stop()
        client.close()
        storage.close()


def test_a_broker_cut_off_from_zookeeper_leads_beside_the_new_leader_and_nothing_runs_twice(
        mysql_url, zk_hosts, relay, spawn, tmp_path, record_property):
    """The maintenance leader is the one cut off: it goes on running its jobs while the other
    broker, elected once the cut-off session ended, runs the same ones. A worker killed meanwhile
    leaves leases that both leaders expire; each message still ends SUCCESS once, and only the
    killed worker's messages run again."""
    topic, log = "fault.partition.leader", tmp_path / "runs.log"
    settings = Settings.from_env({"TIDEMQ_ZK_SESSION_TIMEOUT": str(SESSION)}, db_url=mysql_url, zk_hosts=zk_hosts)
    env = process_env(settings, TIDEMQ_ZK_SESSION_TIMEOUT=str(SESSION), FAULT_LOG=str(log), FAULT_TOPIC=topic,
                      FAULT_TTR="2", FAULT_SLEEP="0.04")
    # 40 ms handlers, 4 at a time per worker: the 250 messages a second offered keep both busy,
    # so the worker killed holds a full hand of leases.
    client = Client(settings)
    storage = open_storage(mysql_url)
    load = ProduceLoad(client, topic, timeout=3.0, every=0.2)
    try:
        cut_off, cut_address = start_broker_process(spawn, tmp_path,
                                                    {**env, "TIDEMQ_ZK_HOSTS": _through(relay, zk_hosts)}, "cut")
        wait_until(lambda: client.coordinator.leader() == cut_address, 30, 0.05, "the first broker to lead")
        stack = Stack(spawn, tmp_path, env, brokers=1, workers=2)
        stack.brokers["cut"] = cut_off
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, what="two workers registered")
        wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="two brokers discovered")
        load.start()
        wait_until(lambda: successes(storage, topic) >= 500, 60, 0.1, "consumption before the partition")

        relay.cut()
        cut_at = time.time()
        wait_until(lambda: client.coordinator.leader() not in (None, cut_address), 10 * SESSION, 0.05,
                   "the other broker to be elected")
        elected_at = time.time()
        victim = stack.workers.pop("worker0")
        killed_at = kill9(victim)
        stack.workers["worker0-again"] = spawn("worker0-again",
                                               TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
        # The killed worker's leases (ttr 2 s) run out while both brokers lead.
        time.sleep(max(0.0, max(cut_at + 3 * SESSION, killed_at + 2 + 2) - time.time()))
        relay.heal()
        healed_at = time.time()

        wait_until(lambda: len(client.pool.addresses()) == 2, 30, 0.05, "the cut-off broker registered again")
        done = successes(storage, topic)
        wait_until(lambda: successes(storage, topic) >= done + 500, 60, 0.1, "consumption after the partition")
        load.stop()

        stack.assert_alive()
        figures = check_calls(load) + ", " + check_outcome(storage, topic, load.acked, log)
        expired, expired_by = {}, collections.Counter()
        for message in all_messages(storage, topic):
            events = [e for e in trace.parse(message.trace) if e["event"] == "LEASE_EXPIRED"]
            if events:
                expired[message.id] = len(events)
                expired_by.update("the cut-off broker" if e.get("broker") == cut_address else "the other"
                                  for e in events)
        assert expired, "the premise failed: the killed worker held no lease"
        assert max(expired.values()) == 1, f"a lease expired twice (two leaders): {expired}"
        killed_ran = {int(line.split()[0]) for line in log.read_text().splitlines()
                      if line.strip() and int(line.split()[1]) == victim.pid}
        twice = reruns(log)
        assert set(twice) <= killed_ran & set(expired), \
            f"messages ran twice that the killed worker never ran or whose lease never expired: {sorted(twice)[:5]}"
        assert client.coordinator.leader() != cut_address, "the broker that was cut off took the lead back"
        named = stack.assert_fault_named_once(r"zookeeper|kazoo|session", at_most=3)
        figures += (f", the other broker elected {elected_at - cut_at:.1f} s after the cut, {len(expired)} leases "
                    f"expired (each once; by {dict(expired_by)}), re-runs {len(twice)}, "
                    f"cut {healed_at - cut_at:.1f} s, records naming it: {named}")
        record_property("figures", figures)
        print(f"\nzookeeper partition, leader: {figures}")
    finally:
        load.stop()
        client.close()
        storage.close()


def test_a_serial_consumer_cut_off_from_zookeeper_never_runs_beside_the_new_top(
        mysql_url, zk_hosts, relay, record_property):
    topic = "fault.partition.serial"
    settings = Settings.from_env({"TIDEMQ_ZK_SESSION_TIMEOUT": str(SESSION)}, db_url=mysql_url, zk_hosts=zk_hosts)
    cut_settings = Settings.from_env({"TIDEMQ_ZK_SESSION_TIMEOUT": str(SESSION)}, db_url=mysql_url,
                                     zk_hosts=_through(relay, zk_hosts))
    broker = BrokerServer(settings).start()
    serial = SerialRuns(sleep=0.002)
    clients, workers = [], {}
    try:
        # The worker to be cut off registers first: it holds the top rank, the one that runs.
        for name, worker_settings in (("cut", cut_settings), ("other", settings)):
            clients.append(Client(worker_settings))
            spec = ConsumerSpec(topic, MessageType.SERIAL_QUEUE, serial.handler(name), threads=1, ttr=3, batch=1)
            workers[name] = Worker([spec], client=clients[-1], drain_timeout=10).start()
            wait_until(lambda: workers[name].runners[0].rank[0] >= 0, 30, what=f"{name} registered")
        assert workers["cut"].runners[0].rank[0] == 0, "the premise failed: the first consumer is not the top one"
        producer = clients[-1]
        load = ProduceLoad(producer, topic, timeout=3.0, every=0.5)  # 100 a second, one broker: ids in order
        load.start()
        try:
            wait_until(lambda: len(serial.runs) >= 100, 60, what="serial work under way")
            relay.cut()
            cut_at = time.monotonic()
            wait_until(lambda: workers["other"].runners[0].rank[0] == 0, 10 * SESSION, 0.05,
                       "the other consumer to become the top one")
            took_over = time.monotonic()
            time.sleep(max(0.0, cut_at + 3 * SESSION - time.monotonic()))
            during = collections.Counter(run.worker for run in list(serial.runs) if took_over <= run.start)
            relay.heal()
            wait_until(lambda: workers["cut"].runners[0].rank[0] == 1, 30, 0.05,
                       "the cut-off consumer registered again, as the newest")
            done = len(serial.runs)
            wait_until(lambda: len(serial.runs) >= done + 100, 60, what="serial work after the partition")
        finally:
            load.stop()
        check_calls(load)
        wait_until(lambda: broker.storage.counts.count_by_status(topic).get(topic, {}) == {"SUCCESS": len(load.acked)},
                   120, 0.05, "every serial message to succeed")
        stored = sorted(all_messages(broker.storage, topic), key=lambda m: (m.effect_time, m.id))
    finally:
        for worker in workers.values():
            worker.stop()
        for client in clients:
            client.close()
        broker.stop(grace=1)

    serial.assert_one_at_a_time_in_order([m.id for m in stored])
    assert sum(during.values()) > 0, "nothing of the serial topic ran while its top consumer was cut off"
    by = collections.Counter(run.worker for run in serial.runs)
    figures = (f"{len(stored)} serial messages, runs by worker {dict(by)}, {dict(during)} while cut off, "
               f"the other consumer on top {took_over - cut_at:.1f} s after the cut, overlaps {serial.overlaps}")
    record_property("figures", figures)
    print(f"\nzookeeper partition, serial: {figures}")
