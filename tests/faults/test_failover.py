"""A killed consumer's work moves on quickly: a QUEUE shard before ZooKeeper ends the dead
session (live consumers take messages stranded past the grace), a SERIAL_QUEUE within a short
session, never two running. Times are printed; the bounds asserted are functional ones, far from
the figures (speed is measured in ``make bench ARGS=pressure``)."""

from __future__ import annotations

import signal
import statistics
import threading
import time

from tests.observe import all_messages, success_records
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, trace
from tidemq_broker.storages import open_storage


def _runs(log) -> list[tuple[int, int, int, float, float]]:
    """(id, pid, attempt, start, end) of every completed handler run."""
    if not log.exists():
        return []
    return [(int(i), int(p), int(a), float(s), float(e))
            for i, p, a, s, e in (line.split() for line in log.read_text().splitlines() if line.strip())]


def test_a_killed_workers_shard_is_taken_over_before_its_session_ends(settings, spawn, tmp_path):
    log, topic = tmp_path / "runs.log", "fault.shard"
    # The default 10 s session: the dead worker stays registered, and its shard with it, for all
    # of the measured window; only the stranded rule can move its messages.
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=topic, FAULT_TTR="10", FAULT_SLEEP="0.001",
                      TIDEMQ_ZK_SESSION_TIMEOUT="10")
    start_broker_process(spawn, tmp_path, env)
    workers = [spawn(f"w{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env) for i in range(2)]
    client = Client(settings)
    storage = open_storage(settings.db_url)
    sent: dict[int, float] = {}
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            at = time.time()
            sent[client.produce(topic, {"at": at})] = at
            stop.wait(0.02)

    try:
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 2, 30, what="two workers registered")
        producer = threading.Thread(target=produce)
        producer.start()
        wait_until(lambda: len(_runs(log)) >= 100, 60, what="both workers under way")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        killed_at = time.time()
        wait_until(lambda: time.time() > killed_at + 6, 10, 0.1, "six seconds of production after the kill")
        stop.set()
        producer.join(30)
        assert len(client.coordinator.consumers(topic)) == 2, "the premise failed: the dead session ended already"
        wait_until(lambda: storage.counts.count_by_status(topic).get(topic, {}).get("SUCCESS", 0) == len(sent), 60, 0.2,
                   "every message to succeed")
        first_start: dict[int, float] = {}
        for msg_id, _pid, _attempt, start, _end in _runs(log):
            first_start[msg_id] = min(start, first_start.get(msg_id, start))
        after = [first_start[i] - at for i, at in sent.items() if at > killed_at + 0.1]
        assert len(after) > 100
        print(f"\nshard takeover: {len(after)} messages sent after the kill, claim p50 "
              f"{statistics.median(after) * 1000:.0f} ms, max {max(after) * 1000:.0f} ms")
        # Functional bound: without the stranded rule half of them wait for the 10 s session.
        assert max(after) < 5.0
        messages = {m.id: m for m in all_messages(storage, topic)}
        assert set(messages) == set(sent) and all(success_records(m) == 1 for m in messages.values())
        reruns = {i for i, n in _count(_runs(log)).items() if n > 1}
        expired = {i for i, m in messages.items()
                   if any(e["event"] == "LEASE_EXPIRED" for e in trace.parse(m.trace))}
        assert reruns <= expired, "only what the killed worker held may run twice"
    finally:
        stop.set()
        client.close()
        storage.close()


def test_serial_work_moves_on_within_a_short_session_and_never_two_at_once(settings, spawn, tmp_path):
    log, topic = tmp_path / "runs.log", "fault.serial"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=topic, FAULT_TYPE="SERIAL_QUEUE", FAULT_TTR="2",
                      FAULT_SLEEP="0.05", FAULT_AHEAD="0", TIDEMQ_ZK_SESSION_TIMEOUT="2")
    start_broker_process(spawn, tmp_path, env)
    workers = {}
    for i in range(3):  # started in turn: the first registered is the top consumer
        workers[i] = spawn(f"w{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(settings)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(topic)) == 3, 30, what="three workers registered")
        ids = client.produce_many(topic, [{"n": n} for n in range(120)])
        wait_until(lambda: len(_runs(log)) >= 30, 60, what="the top consumer under way")
        [top] = {pid for _i, pid, _a, _s, _e in _runs(log)}
        victim = next(p for p in workers.values() if p.pid == top)
        victim.send_signal(signal.SIGKILL)  # most likely mid-handler: its message is RUNNING
        victim.wait(10)
        killed_at = time.time()
        wait_until(lambda: storage.counts.count_by_status(topic).get(topic, {}).get("SUCCESS", 0) == len(ids), 120, 0.2,
                   "every message to succeed")
        runs = sorted(_runs(log), key=lambda run: run[3])
        resumed = min(start for _i, pid, _a, start, _e in runs if pid != top)
        print(f"\nserial failover: next run {(resumed - killed_at) * 1000:.0f} ms after the kill "
              f"(session 2 s, ttr 2 s)")
        assert resumed > killed_at - 0.01 and resumed - killed_at < 6.0  # the old way: a 10 s session
        for before, after in zip(runs, runs[1:]):
            assert after[3] >= before[4], f"two serial messages ran at once: {before} {after}"
        assert list(dict.fromkeys(run[0] for run in runs)) == sorted(ids), "serial order broken"
        messages = {m.id: m for m in all_messages(storage, topic)}
        assert all(success_records(m) == 1 for m in messages.values())
    finally:
        client.close()
        storage.close()


def _count(runs) -> dict[int, int]:
    counts: dict[int, int] = {}
    for msg_id, *_rest in runs:
        counts[msg_id] = counts.get(msg_id, 0) + 1
    return counts
