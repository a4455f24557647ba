"""QUEUE against real MariaDB, ZooKeeper, a broker process and worker processes that join and
are killed with -9: every message ends SUCCESS exactly once and nothing is stranded."""

from __future__ import annotations

from collections import Counter


from tests.integration.handlers_common import read_log
from tests.observe import all_messages, count
from tests.processes import kill9, start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq import trace

TOPIC = "it.queue"



def test_workers_joining_and_killed_leave_every_message_success_once(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    log = tmp_path / "handler.log"
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": TOPIC, "HANDLER_TTR": "2", "HANDLER_SLEEP": "0.01", "HANDLER_THREADS": "4"}
    start_broker_process(spawn, tmp_path, env, "broker")
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    try:
        workers = [start_worker(spawn, f"w{i}", "tests.integration.handlers_queue", env) for i in range(3)]
        wait_registered(client.coordinator, TOPIC, 3)
        ids = client.produce_many(TOPIC, list(range(600)))
        wait_until(lambda: len(read_log(log)) >= 200, 60, what="workers consuming")
        kill9(workers[0])  # mid-stream, most likely mid-message: its leases must expire and move on
        workers.append(start_worker(spawn, "w3", "tests.integration.handlers_queue", env))
        ids += client.produce_many(TOPIC, list(range(600)))
        wait_until(lambda: len(read_log(log)) >= 700, 60, what="consuming after the first kill")
        kill9(workers[1])
        workers.append(start_worker(spawn, "w4", "tests.integration.handlers_queue", env))
        ids += client.produce_many(TOPIC, list(range(600)))
        # The killed workers' nodes vanish when their sessions expire; then ranks cover every shard.
        wait_until(lambda: count(mysql_store, TOPIC, "SUCCESS") == len(ids), 90, 0.2, "every message SUCCESS")
    finally:
        client.close()

    messages = all_messages(mysql_store, TOPIC)
    assert sorted(m.id for m in messages) == sorted(ids)
    assert {m.status for m in messages} == {"SUCCESS"}
    runs = Counter(e.id for e in read_log(log) if e.end is not None)
    totals = set()
    for m in messages:
        events = trace.parse(m.trace)
        assert [e["event"] for e in events].count("SUCCESS") == 1, m.trace
        totals |= {e["rank"].split("/")[1] for e in events if e["event"] == "LOCKED"}
        if runs[m.id] != 1:
            # Ran twice only because a killed worker held it: its lease had to expire first.
            assert runs[m.id] > 1 and "LEASE_EXPIRED" in m.trace, (m.id, runs[m.id], m.trace)
    assert set(runs) == set(ids)
    assert len(totals) >= 2, f"ranks were never recomputed: totals seen {totals}"
