"""kill -9 worker processes in the middle of their handlers: every message still succeeds, and
re-runs happen only for messages whose holder died."""

from __future__ import annotations

import signal

from tests.observe import all_messages, handler_runs, success_records
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
from tidemq import trace
from tidemq_broker.storages import open_storage

TOPIC = "fault.workers"


def test_killed_workers_lose_nothing_and_only_their_messages_rerun(settings, spawn, tmp_path):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="2", FAULT_SLEEP="0.02")
    start_broker_process(spawn, tmp_path, env)
    workers = {f"w{i}": spawn(f"w{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env) for i in range(3)}
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 3, 30, what="three workers registered")
        ids = []
        for start in range(0, 3000, 100):
            ids += client.produce_many(TOPIC, [{"n": n} for n in range(start, start + 100)])
        killed_pids = []
        for round_ in range(2):
            wait_until(lambda: len(handler_runs(log)) >= 600 * (round_ + 1), 120, what="handlers under way")
            name, proc = sorted(workers.items())[round_]
            proc.send_signal(signal.SIGKILL)  # mid-handler: each handler sleeps 20 ms, 4 at a time
            proc.wait(10)
            killed_pids.append(proc.pid)
            workers[f"{name}-again"] = spawn(f"{name}-again", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)

        def settled():
            counts = storage.count_by_status(TOPIC).get(TOPIC, {})
            return counts.get("SUCCESS", 0) == len(ids)

        wait_until(settled, 180, 0.2, "every message to succeed")
        messages = {m.id: m for m in all_messages(storage, TOPIC)}
        assert set(messages) == set(ids)
        assert all(success_records(m) == 1 for m in messages.values())
        runs = handler_runs(log)
        assert set(runs) == set(ids), "some message never ran to completion"
        rerun = {i for i, n in runs.items() if n > 1}
        expired = {i for i, m in messages.items() if any(e["event"] == "LEASE_EXPIRED" for e in trace.parse(m.trace))}
        # A message runs again only after its lease expired, which happens only to messages
        # that a killed worker held (leased and maybe finished, but not yet acked).
        assert rerun <= expired, f"re-run without a lost lease: {sorted(rerun - expired)[:5]}"
        lost_by = {e.get("lost_by", "") for i in expired for e in trace.parse(messages[i].trace) if e["event"] == "LEASE_EXPIRED"}
        assert all(any(f"-{pid}-" in node for pid in killed_pids) for node in lost_by), lost_by
        print(f"\nworker kills: 2, messages {len(ids)}, leases lost {len(expired)}, handler re-runs {len(rerun)}")
    finally:
        client.close()
        storage.close()
