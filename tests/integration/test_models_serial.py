"""SERIAL_QUEUE against real MariaDB, ZooKeeper, a broker process and three worker processes; the
top-ranked worker is killed with -9 in the middle of a message. The handler log must show at
most one handler running at any instant, strict (effect_time, id) order, and a failed message
retried before any later one."""

from __future__ import annotations


from tests.integration.handlers_common import read_log
from tests.observe import all_messages, count
from tests.processes import kill9, start_broker_process, start_worker, wait_registered
from tests.servers import wait_until
from tidemq import Client, Settings
from tidemq import trace

TOPIC = "it.serial"



def intervals(entries, killed_pid, killed_at):
    """(start, end, id, pid) per handler run; a run of the killed process without an end ends at the kill."""
    ended = {(e.id, e.pid, e.start): e.end for e in entries if e.end is not None}
    runs = []
    for e in entries:
        if e.end is None:
            end = ended.get((e.id, e.pid, e.start))
            if end is None:
                assert e.pid == killed_pid, f"run of {e.id} in {e.pid} never ended but that process was not killed"
                end = killed_at
            runs.append((e.start, end, e.id, e.pid))
    return sorted(runs)


def test_top_worker_killed_mid_message_keeps_one_at_a_time_in_order(mysql_url, zk_hosts, spawn, tmp_path, mysql_store):
    log = tmp_path / "handler.log"
    env = {"TIDEMQ_DB_URL": mysql_url, "TIDEMQ_ZK_HOSTS": zk_hosts, "HANDLER_LOG": str(log),
           "HANDLER_TOPIC": TOPIC, "HANDLER_TTR": "2", "HANDLER_SLEEP": "0.03"}
    start_broker_process(spawn, tmp_path, env, "broker")
    client = Client(Settings.from_env({"TIDEMQ_ZK_HOSTS": zk_hosts}))
    try:
        workers = []
        for i in range(3):  # one by one, so the first is the oldest registration: rank 0
            workers.append(start_worker(spawn, f"w{i}", "tests.integration.handlers_serial", env))
            wait_registered(client.coordinator, TOPIC, i + 1)
        datas = [{"n": i} for i in range(40)]
        datas[12] = {"n": 12, "sleep": 1.5}  # the top worker is killed while running this one
        datas[25] = {"n": 25, "fail_first": True}
        ids = client.produce_many(TOPIC, datas, retry=[0.3])
        victim = ids[12]
        wait_until(lambda: any(e.id == victim and e.end is None for e in read_log(log)), 60,
                   what="the top worker running the long message")
        top = read_log(log)[0].pid
        assert top == workers[0].pid, "only the top-ranked worker may run a serial topic"
        killed_at = kill9(workers[0])
        wait_until(lambda: count(mysql_store, TOPIC, "SUCCESS") == len(ids), 60, 0.2, "every message SUCCESS")
    finally:
        client.close()

    entries = read_log(log)
    runs = intervals(entries, top, killed_at)
    for (s1, e1, id1, _), (s2, _, id2, _) in zip(runs, runs[1:]):
        assert e1 <= s2, f"message {id2} started at {s2} while {id1} ran until {e1}"
    started = [run[2] for run in runs]
    assert started == sorted(started), "runs began out of (effect_time, id) order"
    done = [e.id for e in entries if e.end is not None and e.extra != "failed"]
    assert done == ids, "each message must complete once, in order"
    rerun = [run for run in runs if run[2] == victim]
    assert len(rerun) == 2 and rerun[1][3] != top and rerun[1][0] >= killed_at
    failed = [i for i, run in enumerate(runs) if run[2] == ids[25]]
    assert len(failed) == 2 and failed[1] == failed[0] + 1, "the failed message is retried before the next"
    for m in all_messages(mysql_store, TOPIC):
        assert [e["event"] for e in trace.parse(m.trace)].count("SUCCESS") == 1
