"""MariaDB crashes (kill -9) and comes back under load: produce fails fast with a retriable error
during the outage, the broker recovers by itself, and no acknowledged message is lost."""

from __future__ import annotations

import threading
import time

from tests.observe import all_messages, handler_runs
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client
from tidemq.errors import RetriableError, TidemqError
from tidemq_broker.storages import open_storage

TOPIC = "fault.database"
CALL_TIMEOUT = 3.0


def test_database_crash_and_restart_under_load(settings, spawn, tmp_path, mariadb):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="5")
    start_broker_process(spawn, tmp_path, env)
    spawn("worker", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
    client = Client(settings)
    acked: list[int] = []
    calls: list[tuple[float, float, object]] = []  # (start, duration, error or None)
    stop = threading.Event()

    def produce_loop():
        while not stop.is_set():
            started = time.monotonic()
            try:
                acked.extend(client.produce_many(TOPIC, [{"t": started}] * 20, timeout=CALL_TIMEOUT))
                calls.append((started, time.monotonic() - started, None))
            except TidemqError as exc:
                calls.append((started, time.monotonic() - started, exc))
                stop.wait(0.05)

    producer = threading.Thread(target=produce_loop)
    try:
        wait_until(lambda: client.coordinator.consumers(TOPIC), 30, what="worker registered")
        producer.start()
        wait_until(lambda: len(acked) >= 1000, 60, what="load before the crash")
        mariadb.kill()
        crashed_at = time.monotonic()
        wait_until(lambda: any(err is not None and s > crashed_at for s, _, err in calls), 30,
                   what="a produce call to fail during the outage")
        time.sleep(2.0)  # the outage itself: the database stays down for a while
        mariadb.start()
        restarted_at = time.monotonic()
        wait_until(lambda: any(err is None and s > restarted_at for s, _, err in calls), 60, 0.1,
                   "the broker to recover by itself")
        recovered_after = min(s + d for s, d, err in calls if err is None and s > restarted_at) - restarted_at
        count_before = len(acked)
        wait_until(lambda: len(acked) >= count_before + 500, 60, what="load after recovery")
        stop.set()
        producer.join(30)

        errors = [err for _, _, err in calls if err is not None]
        slowest = max(d for _, d, _ in calls)
        assert errors, "the outage should have failed some calls"
        assert all(isinstance(err, RetriableError) for err in errors), {type(e).__name__ for e in errors}
        # No call hangs past its timeout (plus scheduling slack on a loaded 2-core machine).
        assert slowest < CALL_TIMEOUT + 2.0, f"a produce call took {slowest:.1f} s"

        storage = open_storage(settings.db_url)
        try:
            wait_until(lambda: storage.count_by_status(TOPIC).get(TOPIC, {}).get("SUCCESS", 0) >= len(set(acked)),
                       120, 0.2, "acknowledged messages to be consumed")
            stored = {m.id for m in all_messages(storage, TOPIC)}
        finally:
            storage.close()
        lost = set(acked) - stored
        assert not lost, f"{len(lost)} acknowledged messages lost"
        assert set(handler_runs(log)) >= set(acked)
        print(f"\ndatabase crash: {len(errors)} calls failed fast (slowest call {slowest:.2f} s, "
              f"{ {type(e).__name__ for e in errors} }), recovered {recovered_after:.2f} s after restart, "
              f"acked {len(acked)}, lost {len(lost)}")
    finally:
        stop.set()
        client.close()
