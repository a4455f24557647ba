"""A whole stack stopped at once: brokers and workers get SIGTERM together, under load. Every
process exits cleanly within its drain timeout (a worker whose brokers are gone leaves its leases
to expire instead of trying to ack forever), and once a broker and a worker run again every
acknowledged message succeeds; a message runs twice only if its lease expired with the stop."""

from __future__ import annotations

import signal
import time

from tests.faults.load import ProduceLoad, check_calls, check_outcome
from tests.faults.stack import Stack, reruns, successes
from tests.observe import all_messages
from tests.processes import TIDEMQ, process_env, start_broker_process
from tests.servers import wait_until
from tidemq import Client, trace
from tidemq_broker.storages import open_storage

TOPIC = "fault.stop"
DRAIN = 3.0  # the workers' --drain-timeout
BROKER_GRACE = 10.0  # what `tidemq broker` gives running calls on SIGTERM
EXIT = 3.0  # an interpreter's own exit after its drain, on a busy machine


def test_brokers_and_workers_stopped_together_exit_within_their_drain(settings, spawn, tmp_path, record_property):
    log = tmp_path / "runs.log"
    env = process_env(settings, FAULT_LOG=str(log), FAULT_TOPIC=TOPIC, FAULT_TTR="3", FAULT_SLEEP="0.05")
    stack = Stack(spawn, tmp_path, env, brokers=2, workers=2, worker_args=("--drain-timeout", str(DRAIN)))
    client = Client(settings)
    load = ProduceLoad(client, TOPIC, timeout=3.0, every=0.2)
    storage = open_storage(settings.db_url)
    try:
        wait_until(lambda: len(client.coordinator.consumers(TOPIC)) == 2, 30, what="two workers registered")
        load.start()
        wait_until(lambda: successes(storage, TOPIC) >= 300, 60, what="consumption under way")
        stopped_at = time.monotonic()
        for proc in stack.processes.values():
            proc.send_signal(signal.SIGTERM)
        took = {}
        for name, proc in stack.processes.items():
            limit = (BROKER_GRACE + 1 if name.startswith("broker") else DRAIN) + EXIT
            proc.wait(max(stopped_at + limit - time.monotonic(), 0.1))  # raises if it hangs
            took[name] = time.monotonic() - stopped_at
            assert proc.returncode == 0, f"{name} exited with {proc.returncode}: {proc.log_path.read_text()[-2000:]}"
        wait_until(lambda: load.failed_since(stopped_at), 30, what="a produce call to fail with every broker gone")

        # A broker and a worker again: whatever the stopped stack held comes back and runs.
        start_broker_process(spawn, tmp_path, env, "broker-again")
        spawn("worker-again", TIDEMQ + ["worker", "tests.faults.handlers_faults"], env)
        done = len(load.acked)
        wait_until(lambda: len(load.acked) >= done + 200, 60, what="produce through the new broker")
        load.stop()
        figures = check_calls(load) + ", " + check_outcome(storage, TOPIC, load.acked, log)
        twice = set(reruns(log))
        expired = {m.id for m in all_messages(storage, TOPIC)
                   if any(e["event"] == "LEASE_EXPIRED" for e in trace.parse(m.trace))}
        assert twice <= expired, f"ran twice without a lease lost in the stop: {sorted(twice - expired)[:5]}"
        figures += (", exit after SIGTERM " + ", ".join(f"{name} {s:.1f} s" for name, s in sorted(took.items())) +
                    f", leases left to expire {len(expired)}, re-runs {len(twice)}")
        record_property("figures", figures)
        print(f"\nstack stopped at once: {figures}")
    finally:
        load.stop()
        client.close()
        storage.close()
