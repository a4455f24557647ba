"""A consumer's ZooKeeper session expires, then the ensemble's leader is killed, while a
SERIAL_QUEUE topic runs: consumers re-register and never run two messages of it at once."""

from __future__ import annotations

import threading
import time

from tests.servers import wait_until
from tidemq import Client, Message, MessageType, Settings, Worker
from tidemq.consumer import ConsumerSpec
from tidemq_broker.server import BrokerServer

TOPIC = "fault.zk.serial"


def test_session_expiry_and_leader_kill_keep_serial_order_and_exclusivity(ensemble, ensemble_chroot, mysql_url):
    settings = Settings.from_env({}, db_url=mysql_url, zk_hosts=ensemble.hosts + ensemble_chroot)
    broker = BrokerServer(settings).start()
    intervals: list[tuple[int, float, float, int]] = []
    running = [0]
    overlaps = [0]
    lock = threading.Lock()

    def make_handler(worker_no):
        def handle(message: Message) -> None:
            with lock:
                running[0] += 1
                overlaps[0] += running[0] > 1
            start = time.monotonic()
            time.sleep(0.005)
            with lock:
                running[0] -= 1
                intervals.append((message.id, start, time.monotonic(), worker_no))
        return handle

    workers, clients = [], []
    try:
        for n in range(3):
            client = Client(settings)
            clients.append(client)
            spec = ConsumerSpec(TOPIC, MessageType.SERIAL_QUEUE, make_handler(n), threads=1, ttr=3, batch=1)
            workers.append(Worker([spec], client=client, drain_timeout=10).start())
        wait_until(lambda: len(clients[0].coordinator.consumers(TOPIC)) == 3, 30, what="three consumers")
        ids = []
        for start in range(0, 240, 40):
            ids += clients[0].produce_many(TOPIC, [{"n": n} for n in range(start, start + 40)])

        wait_until(lambda: len(intervals) >= 40, 60, what="serial work under way")
        top = min(workers, key=lambda w: w.runners[0].rank[0])
        old_node = top.runners[0].registration.node
        top.client.coordinator.expire_session()
        wait_until(lambda: top.runners[0].registration.node != old_node, 30, what="re-registration after expiry")
        new_rank = wait_until(lambda: top.runners[0].rank[0] >= 0 and top.runners[0].rank, 30, what="a rank again")
        assert new_rank[0] == 2, "a consumer that registers again is the newest: it must not take the top rank back"

        wait_until(lambda: len(intervals) >= 120, 60, what="work after the session expiry")
        ensemble.leader().kill()
        wait_until(lambda: broker.storage.count_by_status(TOPIC) == {TOPIC: {"SUCCESS": len(ids)}}, 120, 0.05,
                   "every serial message to succeed")
    finally:
        for worker in workers:
            worker.stop()
        for client in clients:
            client.close()
        broker.stop(grace=1)

    assert overlaps[0] == 0, f"{overlaps[0]} times two serial handlers ran at once"
    ordered = sorted(intervals, key=lambda iv: iv[1])
    assert [iv[0] for iv in ordered] == ids, "serial messages ran out of (effect_time, id) order"
    assert all(a[2] <= b[1] for a, b in zip(ordered, ordered[1:])), "handler intervals overlap"
    print(f"\nzookeeper faults: {len(ids)} serial messages, workers used {sorted({iv[3] for iv in intervals})}, "
          f"overlaps {overlaps[0]}")
