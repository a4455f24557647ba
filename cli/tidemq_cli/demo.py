"""The demo ``make demo`` runs: produce a few messages of each model, consume them, report."""

from __future__ import annotations

import logging
import os
import tempfile
import sys
import threading
import time
from typing import Any

from tidemq import Message, MessageType, Worker
from tidemq.consumer import ConsumerSpec

from .embedded import embedded

__all__ = ["run_demo"]

_T0 = time.monotonic()


def _say(text: str) -> None:
    # One write per line: handler threads print at the same time, and print() writes the text
    # and its newline separately, so two lines could run together.
    sys.stdout.write(f"[{time.monotonic() - _T0:6.3f}s] {text}\n")
    sys.stdout.flush()


def run_demo(db_path: str) -> int:
    """Run the demo on a fresh SQLite file next to ``db_path``; return 0 when all went as shown."""
    logging.getLogger("tidemq").setLevel(logging.WARNING)  # the demo narrates; keep the logs for problems
    logging.getLogger("tidemq_broker").setLevel(logging.WARNING)
    logging.getLogger("tidemq.queue_runner").setLevel(logging.ERROR)  # the demo reports the failure itself
    workdir = tempfile.mkdtemp(prefix="tidemq-demo-")
    broker, client = embedded(os.path.join(workdir, os.path.basename(db_path)))
    _say(f"broker on {broker.address}, SQLite store in {workdir}, in-process coordination")
    expected = 9
    done = threading.Semaphore(0)
    failed_once: set[int] = set()

    def on_order(message: Message) -> None:
        late_ms = (time.time() - message.effect_time.timestamp()) * 1000
        if message.data.get("fail_first") and message.id not in failed_once:
            failed_once.add(message.id)
            _say(f"QUEUE  order {message.data['order']}: handler raises on attempt {message.attempt} (will retry)")
            raise RuntimeError("payment service timed out")
        _say(f"QUEUE  order {message.data['order']} closed, message {message.id}, attempt {message.attempt}, "
             f"{late_ms:.0f} ms after its effect time")
        done.release()

    def on_ledger(message: Message) -> None:
        _say(f"SERIAL ledger entry {message.data['entry']} applied (one at a time, in order)")
        done.release()

    def on_cache(message: Message) -> None:
        _say(f"TOPIC  cache key {message.data['key']!r} dropped by this worker")
        done.release()

    specs = [
        ConsumerSpec("demo.orders", MessageType.QUEUE, on_order, threads=2, ttr=30, batch=8),
        ConsumerSpec("demo.ledger", MessageType.SERIAL_QUEUE, on_ledger, threads=1, ttr=30, batch=1),
        ConsumerSpec("demo.cache", MessageType.TOPIC, on_cache),
    ]
    worker = Worker(specs, client=client, drain_timeout=5).start()
    try:
        ids = client.produce_many("demo.orders", [{"order": n} for n in (1, 2, 3)])
        _say(f"produced orders 1-3 now: ids {ids}")
        for order, delay in ((4, 1.0), (5, 2.0)):
            msg_id = client.produce("demo.orders", {"order": order}, delay=delay)
            _say(f"produced order {order} with delay={delay} s: id {msg_id}")
        msg_id = client.produce("demo.orders", {"order": 6, "fail_first": True}, retry=[0.5])
        _say(f"produced order 6 whose first attempt fails, retry=[0.5]: id {msg_id}")
        ledger = client.produce_many("demo.ledger", [{"entry": e} for e in ("a", "b")])
        _say(f"produced ledger entries a, b: ids {ledger}")
        _wait_for_topic_consumer(client, "demo.cache")
        seq = client.broadcast("demo.cache", {"key": "users"})
        _say(f"broadcast cache refresh: sequence {seq}")
        ok = all(done.acquire(timeout=15) for _ in range(expected))
        worker.stop()  # drains: every outcome is recorded before the report
        _report(broker)
        _say("demo finished: every message ran" if ok else "demo FAILED: some messages did not run in time")
        return 0 if ok else 1
    finally:
        worker.stop()
        broker.stop()


def _wait_for_topic_consumer(client: Any, topic: str) -> None:
    deadline = time.monotonic() + 5
    while not client.coordinator.consumers(topic) and time.monotonic() < deadline:
        time.sleep(0.01)


def _report(broker: Any) -> None:
    for topic, counts in sorted(broker.storage.counts.count_by_status().items()):
        summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
        _say(f"stored: {topic}: {summary}")
