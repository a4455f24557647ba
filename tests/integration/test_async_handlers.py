"""``async def`` handlers in real ``tidemq worker`` processes on MariaDB and ZooKeeper:
``--concurrency`` of them at once, leases kept by heartbeats, retries, and the SIGTERM drain."""

from __future__ import annotations

import signal

from tests.observe import count
from tests.processes import TIDEMQ, process_env, wait_registered
from tests.servers import wait_until
from tests.integration.handlers_async import TOPIC
from tidemq import trace
from tidemq.lifecycle import MessageStatus

SUCCESS, FAIL, RUNNING = MessageStatus.SUCCESS.value, MessageStatus.FAIL.value, MessageStatus.RUNNING.value


def runs(log) -> list[tuple[int, int, int, float, float]]:
    if not log.exists():
        return []
    return [(int(i), int(pid), int(attempt), float(start), float(end))
            for i, pid, attempt, start, end in (line.split() for line in log.read_text().splitlines())]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def start_worker(spawn, name, env, *flags):
    return spawn(name, TIDEMQ + ["worker", "tests.integration.handlers_async", *flags], env)


def test_concurrency_handlers_run_at_once_past_their_ttr_and_each_message_runs_once(settings, broker, client,
                                                                                    spawn, tmp_path):
    log = tmp_path / "runs.log"
    env = process_env(settings, ASYNC_LOG=str(log), ASYNC_RUN_SECONDS="2.5")
    worker = start_worker(spawn, "w1", env, "--concurrency", "6")
    wait_registered(client.coordinator, TOPIC, 1)
    ids = client.produce_many(TOPIC, [{"n": n} for n in range(12)])
    wait_until(lambda: count(broker.storage, TOPIC, SUCCESS) == 12, 60, 0.1, "every message SUCCESS")
    done = runs(log)
    assert sorted(r[0] for r in done) == ids  # each ran once: 2.5 s is past the 1 s ttr, heartbeats kept it
    assert {r[2] for r in done} == {1} and {r[1] for r in done} == {worker.pid}
    assert most_at_once([(r[3], r[4]) for r in done]) == 6  # --concurrency 6, in one process
    assert worker.poll() is None


def test_a_failing_async_handler_is_retried_on_schedule_then_fails(settings, broker, client, spawn, tmp_path):
    log = tmp_path / "runs.log"
    start_worker(spawn, "w1", process_env(settings, ASYNC_LOG=str(log)))
    wait_registered(client.coordinator, TOPIC, 1)
    recovers = client.produce(TOPIC, {"fail": 1}, retry=[0])
    dies = client.produce(TOPIC, {"fail": 9}, retry=[0, 0])

    def settled():
        a, b = broker.storage.reads.get_message(recovers), broker.storage.reads.get_message(dies)
        return a.status == SUCCESS and b.status == FAIL

    wait_until(settled, 30, 0.1, "one recovered, one dead")
    attempts = {}
    for msg_id, _, attempt, _, _ in runs(log):
        attempts.setdefault(msg_id, []).append(attempt)
    assert attempts == {recovers: [1, 2], dies: [1, 2, 3]}
    events = [e["event"] for e in trace.parse(broker.storage.reads.get_message(dies).trace)]
    assert events.count("RETRY") == 2 and events[-1] == "FAIL"
    errors = [e.get("error", "") for e in trace.parse(broker.storage.reads.get_message(dies).trace)]
    assert "RuntimeError:_attempt_3_fails_on_purpose" in errors[-1]


def test_sigterm_lets_running_async_handlers_finish_and_ack_then_exits(settings, broker, client, spawn, tmp_path):
    log = tmp_path / "runs.log"
    env = process_env(settings, ASYNC_LOG=str(log), ASYNC_RUN_SECONDS="2")
    worker = start_worker(spawn, "w1", env, "--concurrency", "4")
    wait_registered(client.coordinator, TOPIC, 1)
    ids = client.produce_many(TOPIC, [{"n": n} for n in range(4)])
    started = tmp_path / "runs.log.started"
    # Started, not only leased: a SIGTERM while the pull's reply is on its way gives them back.
    wait_until(lambda: started.exists() and len(started.read_text().split()) == 4, 20, 0.02,
               "four handlers under way")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert sorted(r[0] for r in runs(log)) == ids  # every running handler finished, nothing new started
    for msg_id in ids:
        message = broker.storage.reads.get_message(msg_id)
        assert message.status == SUCCESS and message.attempt == 1
        assert not [e for e in trace.parse(message.trace) if e["event"] == "LEASE_EXPIRED"]
    assert client.coordinator.consumers(TOPIC) == []  # it left the topic
