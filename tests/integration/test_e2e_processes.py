"""End to end through real processes: a broker process, two worker processes, real MariaDB and
ZooKeeper; and a broker killed with -9 while produce_many loops."""

from __future__ import annotations

import collections
import signal
import threading

from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tests.observe import list_messages
from tidemq import Client
from tidemq.errors import TidemqError
from tidemq_broker.storages import open_storage


def _success_count(storage, topic):
    return storage.counts.count_by_status(topic).get(topic, {}).get("SUCCESS", 0)


def test_two_workers_share_a_queue_and_run_every_message_once(settings, spawn, tmp_path):
    log = tmp_path / "handled.log"
    env = process_env(settings, E2E_LOG=str(log))
    start_broker_process(spawn, tmp_path, env)
    workers = [spawn(f"worker{i}", TIDEMQ + ["worker", "tests.integration.handlers_e2e"], env) for i in range(2)]
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers("e2e.queue")) == 2, 30, what="two registered workers")
        ids = []
        for start in range(0, 3000, 100):
            ids += client.produce_many("e2e.queue", [{"n": n} for n in range(start, start + 100)])
        ids.append(client.produce("e2e.queue", {"delayed": True}, delay=1.0))
        wait_until(lambda: _success_count(storage, "e2e.queue") == len(ids), 120, 0.1, "every message SUCCESS")
        for worker in workers:  # a clean SIGTERM drains and exits 0
            worker.send_signal(signal.SIGTERM)
        assert [w.wait(60) for w in workers] == [0, 0]
        lines = [line.split() for line in log.read_text().splitlines()]
        runs = collections.Counter(int(msg_id) for msg_id, _ in lines)
        assert sorted(runs) == sorted(ids), "a message was never run, or something unknown ran"
        assert max(runs.values()) == 1, f"ran twice: {[i for i, n in runs.items() if n > 1][:10]}"
        pids = collections.Counter(pid for _, pid in lines)
        assert len(pids) == 2, "both workers should have taken a share"
        assert storage.counts.count_by_status("e2e.queue") == {"e2e.queue": {"SUCCESS": len(ids)}}
    finally:
        client.close()
        storage.close()


def test_broker_killed_with_sigkill_loses_no_acknowledged_message(settings, spawn, tmp_path):
    env = process_env(settings)
    victim, victim_address = start_broker_process(spawn, tmp_path, env, "victim")
    start_broker_process(spawn, tmp_path, env, "survivor")
    client = Client(settings)
    storage = open_storage(settings.db_url)
    acked: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def produce_loop():
        n = 0
        while not stop.is_set():
            try:
                acked.extend(client.produce_many("kill.produce", [{"n": n + i} for i in range(100)], timeout=10))
            except TidemqError as exc:  # a call caught by the kill may fail; it was not acknowledged
                failures.append(repr(exc))
            n += 100

    try:
        wait_until(lambda: len(client.pool.addresses()) == 2, 30, what="both brokers discovered")
        thread = threading.Thread(target=produce_loop)
        thread.start()
        wait_until(lambda: len(acked) >= 2000, 60, what="produce under way")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 2000, 60, what="produce continuing on the survivor")
        stop.set()
        thread.join(60)
        # The dead broker's ephemeral node goes when its ZooKeeper session expires.
        wait_until(lambda: victim_address not in client.pool.addresses(), 30, 0.1, "the dead broker to leave discovery")
        stored_ids = set()
        for status_counts in storage.counts.count_by_status("kill.produce").values():
            assert set(status_counts) == {"NEW"}
        from tidemq_broker.storage import MessageFilter

        last = None
        while True:
            page = list_messages(storage, MessageFilter(topic="kill.produce"), 5000, last)
            if not page:
                break
            stored_ids.update(m.id for m in page)
            last = page[-1].id
        missing = set(acked) - stored_ids
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        assert len(acked) == len(set(acked))
    finally:
        stop.set()
        client.close()
        storage.close()
