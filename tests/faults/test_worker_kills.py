"""kill -9 worker processes in the middle of their handlers: every message still succeeds, and
re-runs happen only for messages whose holder died."""

from __future__ import annotations

import contextlib
import signal
import time
from datetime import timezone
from typing import Iterator

import pytest

from tests.observe import all_messages, handler_runs, success_records
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, clock
from tidemq import trace
from tidemq_broker.storages import open_storage

TOPIC = "fault.workers"


@pytest.mark.parametrize("handlers", ["tests.faults.handlers_faults", "tests.faults.handlers_async"],
                         ids=["threads", "async"])
def test_killed_workers_lose_nothing_and_only_their_messages_rerun(settings, spawn, tmp_path, handlers):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="2", FAULT_SLEEP="0.02")
    start_broker_process(spawn, tmp_path, env)
    workers = {f"w{i}": spawn(f"w{i}", TIDEMQ + ["worker", handlers], env) for i in range(3)}
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
            # Mid-handler: each handler sleeps 20 ms, 4 threads or 8 tasks at a time.
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed_pids.append(proc.pid)
            workers[f"{name}-again"] = spawn(f"{name}-again", TIDEMQ + ["worker", handlers], env)

        def settled():
            counts = storage.counts.count_by_status(TOPIC).get(TOPIC, {})
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
        lost_by = {e.get("lost_by", "") for i in expired for e in trace.parse(messages[i].trace)
                   if e["event"] == "LEASE_EXPIRED"}
        assert all(any(f"-{pid}-" in node for pid in killed_pids) for node in lost_by), lost_by
        print(f"\nworker kills: 2, messages {len(ids)}, leases lost {len(expired)}, handler re-runs {len(rerun)}")
    finally:
        client.close()
        storage.close()


def test_a_worker_killed_holding_messages_leased_ahead_loses_none_of_them(settings, spawn, tmp_path):
    topic = "fault.ahead"
    with _one_worker(settings, spawn, tmp_path, topic, FAULT_TTR="8", FAULT_AHEAD="4") as (log, env, first, client,
                                                                                           storage):
        ids = client.produce_many(topic, [{"n": n} for n in range(10)], delay=6)  # within the prefetch bound (12)
        # The pull takes them about 2 s before they are due (half the 4 s window): kill then.
        wait_until(lambda: storage.counts.count_by_status(topic).get(topic, {}).get("RUNNING", 0) == len(ids), 30, 0.02,
                   "all leased ahead by the first worker")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert handler_runs(log) == {}, "the premise failed: a message ran before the kill"
        spawn("w1", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
        wait_until(lambda: storage.counts.count_by_status(topic).get(topic, {}).get("SUCCESS", 0) == len(ids), 60, 0.2,
                   "every message to succeed after the lease expired")
        messages = {m.id: m for m in all_messages(storage, topic)}
        assert set(messages) == set(ids) and all(success_records(m) == 1 for m in messages.values())
        assert handler_runs(log) == {i: 1 for i in ids}  # each ran once: by the second worker
        for m in messages.values():
            events = [e["event"] for e in trace.parse(m.trace)]
            assert events.count("LOCKED") == 2 and "LEASE_EXPIRED" in events, events
        starts = {int(line.split()[0]): float(line.split()[3]) for line in log.read_text().splitlines()}
        for msg_id, started in starts.items():  # leased ahead again, and still never run early
            assert started >= messages[msg_id].effect_time.replace(tzinfo=timezone.utc).timestamp()


def test_a_killed_workers_held_messages_it_never_started_come_back_long_before_its_ttr(settings, spawn, tmp_path):
    # A worker holds more than it runs (4 handler threads, pulls of 8): what it held but never
    # started had a short lease (``lease_keeper.HOLD``) and comes back once that runs out; what
    # it was running keeps its ttr (60 s here), since it may have had effects already.
    topic = "fault.held"
    with _one_worker(settings, spawn, tmp_path, topic, FAULT_TTR="60", FAULT_SLEEP="120", FAULT_AHEAD="0") as (
            log, env, first, client, storage):
        ids = client.produce_many(topic, [{"n": n} for n in range(8)])

        def leases() -> dict[int, float]:  # id -> seconds its lease has left, of RUNNING ones
            now = clock.now()
            return {m.id: (m.lease_expire - now).total_seconds() for m in all_messages(storage, topic)
                    if m.status == "RUNNING"}

        # The four started are extended by their ttr at the first beat after they start; the
        # other four stay on the short lease while they wait for a handler thread.
        wait_until(lambda: len(leases()) == 8 and sum(left > 30 for left in leases().values()) == 4, 30, 0.05,
                   "four running on their ttr, four held on the short lease")
        running = {i for i, left in leases().items() if left > 30}
        assert all(left < 5 for i, left in leases().items() if i not in running)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed = time.monotonic()
        spawn("w1", TIDEMQ + ["worker", "tests.faults.handlers_faults"], {**env, "FAULT_SLEEP": "0"})
        held = set(ids) - running
        wait_until(lambda: {m.id for m in all_messages(storage, topic) if m.status == "SUCCESS"} == held, 40, 0.2,
                   "the held messages to run on the second worker")
        done = time.monotonic()
        # Well inside the 60 s ttr: the ones the killed worker was running still wait for it.
        assert set(leases()) == running
        messages = {m.id: m for m in all_messages(storage, topic)}
        for msg_id in held:
            events = [e["event"] for e in trace.parse(messages[msg_id].trace)]
            assert events.count("LOCKED") == 2 and "LEASE_EXPIRED" in events, events
        assert handler_runs(log) == {i: 1 for i in held}  # none ran on the killed worker
        print(f"\nworker killed holding {len(held)} messages it never started and running {len(running)} (ttr 60 s): "
              f"the held ones succeeded on another worker {done - killed:.1f} s after the kill (a new worker's "
              "start included), the running ones still wait for their ttr")


@contextlib.contextmanager
def _one_worker(settings, spawn, tmp_path, topic: str, **fault: str) -> Iterator[tuple]:
    """A broker and one worker of ``tests.faults.handlers_faults`` on ``topic`` (``fault``: its
    FAULT_* settings), registered: (its run log, its environment, its process, a client, the
    storage)."""
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=topic, **fault)
    start_broker_process(spawn, tmp_path, env)
    worker = spawn("w0", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 1, 30, what="the first worker registered")
        yield log, env, worker, client, storage
    finally:
        client.close()
        storage.close()
