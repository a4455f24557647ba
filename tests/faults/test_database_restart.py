"""MariaDB stops under load for longer than the consumers' ttr and starts again: produce fails
fast with a retriable error meanwhile, nothing acknowledged is lost, no message runs twice (an
outcome a worker could not report during the outage is reported afterwards, and lease expiry
gives holders a full ttr after the database returns), no process exits, each names the outage
once, and consumption resumes by itself."""

from __future__ import annotations

import time

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.stack import Stack, reruns, successes
from tests.processes import process_env
from tests.servers import wait_until
from tidemq import Client
from tidemq_broker.storages import open_storage

TOPIC = "fault.database"
TTR = 3.0
OUTAGE = 3 * TTR  # every lease held when the database went away runs out during the outage


def test_database_stopped_longer_than_ttr_and_restarted(settings, spawn, tmp_path, mariadb, record_property):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR=str(TTR), FAULT_SLEEP="0.002")
    stack = Stack(spawn, tmp_path, env, brokers=1, workers=2)
    client = Client(settings)
    load = ProduceLoad(client, TOPIC, timeout=3.0, every=0.1)  # up to 500 messages/s
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        load.start()
        wait_until(lambda: successes(storage, TOPIC) >= 1000, 60, what="consumption before the outage")
        stopped_at = time.monotonic()
        mariadb.stop()
        wait_until(lambda: load.failed_since(stopped_at), 30, what="a produce call to fail during the outage")
        time.sleep(max(0.0, stopped_at + OUTAGE - time.monotonic()))  # the outage itself
        mariadb.start()
        restarted_at = time.monotonic()
        wait_until(lambda: load.succeeded_since(restarted_at), 30, 0.1, "produce to succeed again")
        produce_back = min(c.start + c.duration for c in load.calls if c.error is None and c.start > restarted_at)
        before = successes(storage, TOPIC)
        wait_until(lambda: successes(storage, TOPIC) >= before + 500, 30, 0.1, "consumption after the restart")
        load.stop()

        stack.assert_alive()
        figures = check_calls(load) + ", " + check_outcome(storage, TOPIC, load.acked, log)
        twice = reruns(log)
        assert not twice, f"{len(twice)} messages ran twice, none of their workers died: {sorted(twice)[:5]}"
        named = stack.assert_fault_named_once(r"database|mysql|mariadb")
        figures += (f", outage {OUTAGE:.0f} s (ttr {TTR:.0f} s), produce back {produce_back - restarted_at:.2f} s "
                    f"after the restart, records naming it: {named}")
        record_property("figures", figures)
        print(f"\ndatabase outage: {figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
