"""One conformance suite, run against every coordination implementation: in-process and a real
ZooKeeper (each test in its own chroot).

The first half checks the coordinator itself (nodes, watches, broadcasts, pruning, elections,
lost sessions; signals in test_coordination_signals.py); the second runs real consumers (Worker,
QueueRunner, BroadcastRunner) against an embedded broker, so ``tidemq dev`` and a ZooKeeper
cluster are held to the same behaviour.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.servers import wait_until
from tidemq import Client, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq.coordinator import ConnectionState, rank_of
from tidemq.message import MessageType

class Recorder:
    """Collects watch callbacks; ``last`` is the most recent argument."""

    def __init__(self) -> None:
        self.calls: list = []
        self.lock = threading.Lock()

    def __call__(self, value) -> None:
        with self.lock:
            self.calls.append(list(value))

    @property
    def last(self):
        with self.lock:
            return self.calls[-1] if self.calls else None


def test_start_reports_connected(coordinators):
    states = []
    coordinators(listener=states.append)
    wait_until(lambda: ConnectionState.CONNECTED in states, 10, what="CONNECTED reported")


def test_brokers_are_watched_and_leave_on_unregister_and_stop(coordinators):
    a, b = coordinators(), coordinators()
    seen = Recorder()
    a.watch_brokers(seen)
    a.register_broker("127.0.0.1:1001")
    b.register_broker("127.0.0.1:1002")
    wait_until(lambda: seen.last == ["127.0.0.1:1001", "127.0.0.1:1002"], 10, what="both brokers seen")
    a.unregister_broker("127.0.0.1:1001")
    wait_until(lambda: seen.last == ["127.0.0.1:1002"], 10, what="unregistered broker gone")
    b.stop()
    wait_until(lambda: seen.last == [], 10, what="stopped coordinator's broker gone")


def test_consumers_rank_oldest_first_and_every_change_is_seen(coordinators):
    first, second, third = coordinators(), coordinators(), coordinators()
    seen = Recorder()
    stop_watch = first.watch_consumers("t.rank", seen)
    regs = [c.register_consumer("t.rank", f"host-{i}") for i, c in enumerate((first, second, third))]
    nodes = [r.node for r in regs]
    wait_until(lambda: seen.last == nodes, 10, what="three consumers seen in registration order")
    assert first.consumers("t.rank") == nodes
    assert [rank_of(n, nodes) for n in nodes] == [(0, 3), (1, 3), (2, 3)]
    assert "t.rank" in first.consumer_topics()

    second.unregister_consumer(regs[1])
    wait_until(lambda: seen.last == [nodes[0], nodes[2]], 10, what="left consumer gone")
    assert rank_of(nodes[2], seen.last) == (1, 2)
    joined = second.register_consumer("t.rank", "host-9")
    wait_until(lambda: seen.last == [nodes[0], nodes[2], joined.node], 10, what="joiner ranked last")

    first.stop()  # a stopped process leaves the topic: the oldest remaining becomes rank 0
    watcher = Recorder()
    third.watch_consumers("t.rank", watcher)
    wait_until(lambda: watcher.last == [nodes[2], joined.node], 10, what="stopped consumer gone")
    calls_before = len(seen.calls)
    stop_watch()
    third.register_consumer("t.rank", "host-10")
    wait_until(lambda: len(watcher.last) == 3, 10, what="late joiner seen")
    assert len(seen.calls) == calls_before  # a stopped watch hears nothing more


def test_broadcasts_keep_order_and_a_burst_loses_nothing(coordinators):
    sender, reader = coordinators(), coordinators()
    seen = Recorder()
    reader.watch_broadcasts("t.cast", seen)
    sequences = [sender.broadcast("t.cast", f"payload-{i}".encode()) for i in range(200)]
    assert sequences == sorted(set(sequences))
    wait_until(lambda: seen.last == sequences, 20, what="the full list after a burst")
    # Events coalesce (fewer callbacks than broadcasts is fine) but every list is complete.
    assert all(call == sorted(call) for call in seen.calls)
    assert reader.broadcast_sequences("t.cast") == sequences
    assert [reader.read_broadcast("t.cast", s) for s in sequences[:3]] == [b"payload-0", b"payload-1", b"payload-2"]
    assert reader.read_broadcast("t.cast", sequences[-1] + 1000) is None
    assert reader.broadcast_sequences("t.none") == []


def test_pruning_removes_only_old_broadcasts_and_sequences_never_repeat(coordinators):
    coord = coordinators()
    old = [coord.broadcast("t.prune", b"old") for _ in range(3)]
    assert coord.prune_broadcasts(3600) == 0
    assert coord.broadcast_sequences("t.prune") == old
    pruned = []
    wait_until(lambda: pruned.append(coord.prune_broadcasts(0.05)) or sum(pruned) == 3, 10,
               what="old broadcasts pruned")
    assert coord.broadcast_sequences("t.prune") == []
    assert coord.read_broadcast("t.prune", old[0]) is None
    newer = coord.broadcast("t.prune", b"new")
    assert newer > old[-1]  # a consumer's cursor stays valid across pruning
    assert coord.prune_broadcasts(3600) == 0
    assert coord.read_broadcast("t.prune", newer) == b"new"


def test_one_leader_at_a_time_and_the_next_takes_over(coordinators):
    contenders = [coordinators() for _ in range(3)]
    leading: list[str] = []
    overlap = []
    lock = threading.Lock()

    def lead_as(name):
        def lead(lost: threading.Event) -> None:
            with lock:
                if leading:
                    overlap.append((name, list(leading)))
                leading.append(name)
            lost.wait()
            with lock:
                leading.remove(name)
        return lead

    ends = [c.run_for_leader(f"b{i}", lead_as(f"b{i}")) for i, c in enumerate(contenders)]
    first = wait_until(lambda: list(leading), 10, what="a leader")[0]
    wait_until(lambda: contenders[0].leader() == first, 10, what="leader() names the leader")
    ends[int(first[1:])]()
    second = wait_until(lambda: [n for n in leading if n != first], 10, what="the next leader")[0]
    wait_until(lambda: contenders[1].leader() == second, 10, what="leader() follows the change")
    ends[int(second[1:])]()
    third = wait_until(lambda: [n for n in leading if n not in (first, second)], 10, what="the last leader")[0]
    assert {first, second, third} == {"b0", "b1", "b2"}
    ends[int(third[1:])]()
    wait_until(lambda: not leading, 10, what="no leader once every campaign ended")
    assert overlap == []


def test_an_expired_session_registers_again_and_gives_up_leadership(coordinators):
    states = []
    victim = coordinators(listener=states.append)
    other = coordinators()
    victim.register_broker("127.0.0.1:2001")
    reg = victim.register_consumer("t.lost", "victim")
    other_reg = other.register_consumer("t.lost", "other")
    lost_seen = threading.Event()
    led = []

    def lead(lost: threading.Event) -> None:
        led.append(time.monotonic())
        lost.wait()
        lost_seen.set()

    end = victim.run_for_leader("victim", lead)
    wait_until(lambda: led, 10, what="victim leads")
    old_node = reg.node

    victim.expire_session()
    wait_until(lambda: ConnectionState.LOST in states, 15, what="LOST reported")
    assert lost_seen.wait(10), "leadership must end with the session"
    wait_until(lambda: reg.node != old_node, 15, what="a new consumer node")
    wait_until(lambda: other.consumers("t.lost") == [other_reg.node, reg.node], 10,
               what="re-registered consumer ranked after the survivor")
    assert old_node not in other.consumers("t.lost")
    brokers = Recorder()
    other.watch_brokers(brokers)
    wait_until(lambda: brokers.last == ["127.0.0.1:2001"], 10, what="broker node made again")
    wait_until(lambda: len(led) >= 2, 15, what="campaigning again after the lost session")
    end()


# -- consumers against an embedded broker ---------------------------------------------------

@pytest.fixture
def cluster(coordinators, tmp_path):
    """An embedded broker (SQLite store) and ``worker(specs)`` making Workers with their own session."""
    from tidemq_broker.server import BrokerServer

    settings = Settings.from_env(db_url=f"sqlite:///{tmp_path}/coordination.sqlite3", zk_hosts=coordinators.hosts,
                                 brokers="")
    broker = BrokerServer(settings, port=0, coordinator=coordinators()).start()
    workers: list[Worker] = []
    clients: list[Client] = []

    def client() -> Client:
        made = Client(settings, coordinator=coordinators())
        clients.append(made)
        return made

    def worker(specs, instance: str) -> Worker:
        w = Worker(specs, client=client(), instance=instance, drain_timeout=10).start()
        workers.append(w)
        return w

    cluster_ = type("Cluster", (), {})()
    cluster_.broker, cluster_.client, cluster_.worker = broker, client, worker
    yield cluster_
    for w in workers:
        w.stop()
    for c in clients:
        c.close()
    broker.stop(grace=1)


def statuses(broker, ids):
    return [broker.storage.reads.get_message(i).status for i in ids]


def test_queue_consumers_rebalance_as_they_join_and_leave_and_strand_nothing(cluster):
    runs: dict[int, int] = {}
    lock = threading.Lock()

    def handler(message) -> None:
        with lock:
            runs[message.id] = runs.get(message.id, 0) + 1
        time.sleep(0.002)

    spec = ConsumerSpec("t.rebalance", MessageType.QUEUE, handler, threads=4, ttr=5.0, batch=8)
    producer = cluster.client()
    first = cluster.worker([spec], "w1")
    ids = producer.produce_many("t.rebalance", list(range(300)))
    second = cluster.worker([spec], "w2")
    wait_until(lambda: len(runs) >= 100, 30, what="some consumed")
    first.stop()  # leaves mid-stream: its shard must pass to the others
    third = cluster.worker([spec], "w3")
    ids += producer.produce_many("t.rebalance", list(range(300)))
    wait_until(lambda: third.runners[0].rank[1] == 2, 10, what="third sees two consumers")
    wait_until(lambda: statuses(cluster.broker, ids).count("SUCCESS") == len(ids), 60, what="every message SUCCESS")
    assert sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}
    assert second.runners[0].succeeded > 0 and third.runners[0].succeeded > 0


def test_queue_threads_run_handlers_at_once(cluster):
    running, peak = [0], [0]
    lock = threading.Lock()
    release = threading.Event()

    def handler(message) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(10)
        with lock:
            running[0] -= 1

    spec = ConsumerSpec("t.threads", MessageType.QUEUE, handler, threads=4, ttr=30.0, batch=2)
    worker = cluster.worker([spec], "w1")
    ids = cluster.client().produce_many("t.threads", list(range(20)))
    wait_until(lambda: peak[0] == 4, 20, what="four handlers running at once")
    # Bounded prefetch: with 4 threads busy, at most threads + batch messages are leased.
    wait_until(lambda: statuses(cluster.broker, ids).count("RUNNING") == 6, 10, what="prefetch filled")
    assert statuses(cluster.broker, ids).count("RUNNING") <= 6
    release.set()
    wait_until(lambda: statuses(cluster.broker, ids).count("SUCCESS") == 20, 30, what="all done")
    # The runner counts a success when the ack's reply comes back, just after the commit.
    wait_until(lambda: worker.runners[0].succeeded == 20, 10, what="the runner to count every ack")
    assert peak[0] == 4


def test_serial_runs_one_at_a_time_in_order_and_fails_over(cluster):
    log: list[tuple[int, str, float, float]] = []
    failed_once: set[int] = set()
    lock = threading.Lock()

    def handler_for(name):
        def handler(message) -> None:
            start = time.monotonic()
            time.sleep(0.01)
            if message.data == "fail-once" and message.id not in failed_once:
                failed_once.add(message.id)
                with lock:
                    log.append((message.id, name + ":failed", start, time.monotonic()))
                raise RuntimeError("first attempt fails")
            with lock:
                log.append((message.id, name, start, time.monotonic()))
        return handler

    producer = cluster.client()
    datas = ["x"] * 10 + ["fail-once"] + ["x"] * 29
    ids = producer.produce_many("t.serial", datas, retry=[0.3])
    top = cluster.worker([ConsumerSpec("t.serial", MessageType.SERIAL_QUEUE, handler_for("top"),
                                       ttr=5.0, batch=1)], "top")
    wait_until(lambda: top.runners[0].rank == (0, 1), 10, what="top registered")
    backup = cluster.worker([ConsumerSpec("t.serial", MessageType.SERIAL_QUEUE, handler_for("backup"),
                                          ttr=5.0, batch=1)], "backup")
    wait_until(lambda: backup.runners[0].rank == (1, 2), 10, what="backup ranked second")
    wait_until(lambda: len(log) >= 15, 30, what="top ran some")
    top.stop()  # failover: the backup becomes rank 0 and continues in order
    wait_until(lambda: statuses(cluster.broker, ids).count("SUCCESS") == len(ids), 60, what="every message SUCCESS")
    done = [entry for entry in log if not entry[1].endswith(":failed")]
    assert [entry[0] for entry in done] == ids  # strict order, each once
    order = [entry[0] for entry in log]
    assert order.index(ids[10]) < order.index(ids[11])  # the failed one was retried before the next ran
    assert order.count(ids[10]) == 2
    intervals = sorted((start, end) for _, _, start, end in log)
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(intervals, intervals[1:])), "two handlers overlapped"
    assert {entry[1] for entry in done} == {"top", "backup"}


def test_topic_every_online_consumer_gets_a_burst_once_in_order(cluster):
    got: dict[str, list] = {"a": [], "b": [], "c": []}

    def handler_for(name):
        return lambda message: got[name].append(message.data)

    workers = [cluster.worker([ConsumerSpec("t.topic", MessageType.TOPIC, handler_for(n))], n) for n in got]
    sender = cluster.client()
    wait_until(lambda: len(sender.coordinator.consumers("t.topic")) == 3, 10, what="three online")
    for i in range(300):
        sender.broadcast("t.topic", i)
    for name in got:
        wait_until(lambda: len(got[name]) >= 300, 60, what=f"{name} got the burst")
    assert all(values == list(range(300)) for values in got.values())
    # A run is counted once its handler has returned, a moment after the last append.
    wait_until(lambda: all(w.runners[0].succeeded == 300 for w in workers), 10, what="every run counted")
