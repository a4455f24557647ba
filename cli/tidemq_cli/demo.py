"""The demo ``make demo`` runs: produce a few messages of each model, consume them, report;
then work whose outcome the producer waits for: a result, a failure, a running message
cancelled, and a workflow whose last step adds up what the others returned."""

from __future__ import annotations

import logging
import os
import tempfile
import sys
import threading
import time
from typing import Any

from tidemq import Message, MessageType, Worker, WorkflowState, chain, group, sig
from tidemq.consumer import ConsumerSpec
from tidemq.errors import MessageCancelledError, RemoteError

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
    long_running = threading.Event()

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
        *_work_specs(long_running),
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
        ok = _work(client, long_running) and ok
        worker.stop()  # drains: every outcome is recorded before the report
        _report(broker)
        _say("demo finished: every message ended as shown" if ok else "demo FAILED: some messages did not end as shown")
        return 0 if ok else 1
    finally:
        worker.stop()
        broker.stop()


_REPORT_PARTS = {"2026-11": 4, "2025": 200}  # the demo's reports and their parts (one tenth of a second each)
_LONG = "2025"  # the report the demo cancels while it runs


def _work_specs(long_running: threading.Event) -> list[ConsumerSpec]:
    """The handlers of the demo's second half: reports that return a value and report progress
    (``long_running`` is set once the long one is under way), and the three steps of a workflow."""

    def on_report(message: Message) -> dict[str, Any]:
        month = message.data["month"]
        if month not in _REPORT_PARTS:
            raise ValueError(f"no sales recorded for month {month!r}")
        parts = _REPORT_PARTS[month]
        for n in range(1, parts + 1):
            try:
                message.checkpoint()  # raises once the message's cancel was requested
            except MessageCancelledError:
                _say(f"QUEUE  report {month} stops at part {n} of {parts}: its cancel was requested")
                raise
            time.sleep(0.1)  # the part's work
            message.progress(n, parts, note=f"part {n}")
            if month == _LONG and n == 5:
                long_running.set()
        return {"month": month, "rows": parts * 250}

    def on_fetch(message: Message) -> list[int]:
        _say("WORKFLOW fetch: 3 files found")
        return [120, 80, 50]

    def on_part(message: Message) -> int:
        rows = message.input[message.data["n"]]  # the fetch step's result
        _say(f"WORKFLOW part {message.data['n']}: {rows} rows loaded")
        return rows

    def on_merge(message: Message) -> dict[str, int]:
        total = sum(message.inputs)  # the three parts' results, in the group's order
        _say(f"WORKFLOW merge: {total} rows in all")
        return {"rows": total}

    return [ConsumerSpec("demo.reports", MessageType.QUEUE, on_report, threads=3, ttr=30),
            ConsumerSpec("demo.fetch", MessageType.QUEUE, on_fetch),
            ConsumerSpec("demo.part", MessageType.QUEUE, on_part, threads=3),
            ConsumerSpec("demo.merge", MessageType.QUEUE, on_merge)]


def _work(client: Any, long_running: threading.Event) -> bool:
    """Produce the second half's messages with handles and wait for their outcomes (each wait
    raises ResultTimeoutError after 15 s); True when each ended as shown."""
    report = client.produce("demo.reports", {"month": "2026-11"}, result=True)
    bad = client.produce("demo.reports", {"month": "2026-13"}, retry=0, result=True)
    long = client.produce("demo.reports", {"month": _LONG}, result=True)
    _say(f"produced reports 2026-11, 2026-13 and 2025 with result=True: handles {report.id}, {bad.id}, {long.id}")
    _say(f"report 2026-11 result: {report.result(timeout=15)}")
    try:
        value = bad.result(timeout=15)
        return _failed(f"report 2026-13 succeeded with {value}")
    except RemoteError as exc:
        _say(f"report 2026-13 failed, result() raises RemoteError: {exc.type}: {exc.message}")
    if not long_running.wait(15):
        return _failed("report 2025 did not start")
    # What the broker has of the handler's progress: its reports go with heartbeats, at most
    # about once a second, so the latest may not be there yet.
    progress = long.progress()
    seen = f"progress {progress.done:g} of {progress.total:g} ({progress.note})" if progress else "no progress yet"
    _say(f"report 2025 is {long.status().name}, {seen}: cancel(running=True) -> {long.cancel(running=True)}")
    try:
        value = long.result(timeout=15)
        return _failed(f"report 2025 finished with {value} although cancelled")
    except MessageCancelledError:
        _say(f"report 2025 ended {long.status().name}, result() raises MessageCancelledError")
    steps = chain(sig("demo.fetch"), group(sig("demo.part", {"n": n}) for n in range(3)),
                  sig("demo.merge")).produce(client, result=True)
    _say(f"produced a workflow fetch -> 3 parts -> merge: ids {[step.id for step in steps]}")
    info = client.workflow_handle(steps).wait(timeout=15)
    _say(f"workflow {info.state.name}, {info.steps_total} steps; merge's result: {steps[-1].result(timeout=15)}")
    return info.state is WorkflowState.SUCCEEDED or _failed(f"the workflow ended {info.state.name}")


def _failed(what: str) -> bool:
    _say(f"unexpected: {what}")
    return False


def _wait_for_topic_consumer(client: Any, topic: str) -> None:
    deadline = time.monotonic() + 5
    while not client.coordinator.consumers(topic) and time.monotonic() < deadline:
        time.sleep(0.01)


def _report(broker: Any) -> None:
    for topic, counts in sorted(broker.storage.counts.count_by_status().items()):
        summary = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
        _say(f"stored: {topic}: {summary}")
