"""results: what storing and awaiting results costs.

- latency: ``produce(..., result=True)`` then ``handle.result()`` by a caller waiting on an idle
  system, one worker whose handler returns a small dict: p50 of the whole round trip.
- consume: two workers drain due messages whose handler returns a small dict (stored as each
  message's result, in the ack's transaction) and, alternating over ``--rounds``, the same with a
  handler returning nothing; the ratio of their rates, each timed from the first lock to the
  last SUCCESS.
- waiters: ``--results-waiters`` concurrent ``Results`` long-polls (one asyncio client) on one
  broker of their own while nothing finishes: that broker's CPU per wall second.
- cancel: ``--results-cancels`` messages, one after another, each run by a handler that reports
  no progress and stops only once its cancel is requested (one worker, ttr 120 s: its
  heartbeats come every 40 s); from ``cancel(running=True)``, sent once the handler started, to
  ``result()`` raising ``MessageCancelledError`` in the caller waiting on it, and the Cancel call
  alone. Each cancel is sent at least ``CANCEL_EVERY`` after the previous one was seen ended: a
  worker brings at most one beat per ``CANCEL_EVERY`` forward for cancel signals, and cancels
  back to back would time that limit, not a cancel. Reported, no target.
"""

from __future__ import annotations

import asyncio
import os
import time
from argparse import Namespace

from tidemq import clock
from tidemq.lease_keeper import CANCEL_EVERY

from . import raw
from .env import TIDEMQ, Cluster, CpuMeter, Proc
from .pressure_stats import read_records
from .report import Report, summarize

__all__ = ["run"]

LATENCY_TOPIC = "bench.results.latency"
WITH, WITHOUT = "bench.results.with", "bench.results.without"
IDLE_TOPIC = "bench.results.idle"
CANCEL_TOPIC = "bench.results.cancel"


def _latency(cluster: Cluster, report: Report, args: Namespace) -> None:
    cluster.start_workers(1, LATENCY_TOPIC, {"BENCH_RESULT": "1", "BENCH_BATCH": "1"})
    client = cluster.client()
    try:
        for _ in range(5):  # untimed: channels, the worker's first pulls
            client.produce(LATENCY_TOPIC, {"warm": True}, result=True).result(timeout=60)
        samples = []
        for i in range(args.results_samples):
            began = time.perf_counter()
            value = client.produce(LATENCY_TOPIC, {"i": i}, result=True).result(timeout=60)
            samples.append((time.perf_counter() - began) * 1000)
            assert value["ok"], value
        lat = summarize(samples)
        report.record("results", "produce -> handler -> result, idle", lat, "ms")
        report.target("results", "round trip p50 ms", lat["p50"], "<=", 3.0)
    finally:
        client.close()
        cluster.stop_workers()


def _drain_seconds(cluster: Cluster, report: Report, topic: str, n: int, label: str) -> float:
    """Seconds the workers took to drain ``n`` messages of ``topic`` made due at once, from the
    first lock to the last SUCCESS as the brokers stored them (as the consume scenario times
    its workers): the moment the sleeping pulls hear of the UPDATE that made them due (their
    broker's look at the earliest due time, every 0.5 to 2 s) is not in it."""
    raw.truncate(cluster.db_url)
    raw.load(cluster.db_url, topic, n, lambda i: clock.after(clock.now(), 86400))
    watch = raw.Watch(cluster.db_url)
    try:
        raw.make_due(cluster.db_url, topic)
        began = time.monotonic()
        while watch.unfinished(topic):
            if time.monotonic() - began > max(120.0, n / 200):
                raise TimeoutError(f"{label}: {n:,} messages not drained in time")
            time.sleep(0.05)
    finally:
        watch.close()
    seconds, done = raw.span(cluster.db_url, topic)
    if done != n:
        raise AssertionError(f"{label}: {done:,} of {n:,} messages are SUCCESS")
    report.progress(f"{label}: {n:,} drained in {seconds:.2f} s")
    return seconds


def _consume(cluster: Cluster, report: Report, args: Namespace) -> None:
    options = {"BENCH_THREADS": str(args.worker_threads), "BENCH_BATCH": str(args.worker_batch)}
    cluster.start_workers(2, WITH, {**options, "BENCH_RESULT": "1"})
    cluster.start_workers(2, WITHOUT, options)
    n = args.results_messages
    seconds = {WITH: 0.0, WITHOUT: 0.0}
    try:
        for round_ in range(args.rounds):
            order = (WITH, WITHOUT) if round_ % 2 == 0 else (WITHOUT, WITH)
            for topic in order:
                seconds[topic] += _drain_seconds(cluster, report, topic, n, f"round {round_ + 1}, {topic}")
    finally:
        cluster.stop_workers()
    rates = {topic: n * args.rounds / s for topic, s in seconds.items()}
    report.record("results", "consume, handler returns a dict (stored)", round(rates[WITH]), "msg/s", "2 workers")
    report.record("results", "consume, handler returns nothing", round(rates[WITHOUT]), "msg/s", "2 workers")
    ratio = round(rates[WITH] / rates[WITHOUT], 3)
    report.record("results", "with results / without", ratio, "x")
    report.target("results", "consume with results / without", ratio, ">=", 0.9)


async def _wait_all(address: str, ids: list[int], ready: asyncio.Event, stop: asyncio.Event) -> int:
    from tidemq import Settings
    from tidemq.aio import AsyncClient

    async with AsyncClient(Settings.from_env({}, brokers=address)) as client:
        async def wait(msg_id: int) -> None:
            while not stop.is_set():
                await client.results([msg_id], wait=30.0)

        tasks = [asyncio.create_task(wait(i)) for i in ids]
        ready.set()
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)


def _waiters(cluster: Cluster, report: Report, args: Namespace) -> None:
    count = args.results_waiters
    port_file = os.path.join(cluster.dir, "broker-waiters.port")
    # Each waiting Results call holds one of the broker's RPC threads while it waits.
    proc = Proc("broker-waiters", TIDEMQ + ["broker", "--port", "0", "--port-file", port_file,
                                            "--workers", str(count + 64)], cluster.settings_env, cluster.dir)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            proc.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the waiters' broker did not start")
            time.sleep(0.05)
        with open(port_file) as fh:
            address = f"127.0.0.1:{fh.read().strip()}"
        client = cluster.client()
        try:
            ids = []
            for start in range(0, count, 1000):
                ids += client.produce_many(IDLE_TOPIC, [{"i": i} for i in range(start, min(start + 1000, count))],
                                           delay=3600)
        finally:
            client.close()

        async def measure() -> tuple[int, CpuMeter]:
            ready, stop = asyncio.Event(), asyncio.Event()
            waiting = asyncio.create_task(_wait_all(address, ids, ready, stop))
            await ready.wait()
            await asyncio.sleep(args.results_warmup)  # every call sent and waiting in the broker
            meter = CpuMeter({"broker": [proc.pid]})
            with meter:
                await asyncio.sleep(args.results_idle_seconds)
            stop.set()
            return await waiting, meter

        waited, meter = asyncio.run(measure())
        share = meter.shares()["broker"]
        report.record("results", f"{waited:,} idle waiters: broker CPU", share, "cores",
                      f"over {meter.wall:.1f} s")
        report.target("results", f"{count} idle waiters broker cores", share, "<=", 0.1)
    finally:
        proc.stop()


def _cancel(cluster: Cluster, report: Report, args: Namespace) -> None:
    from tidemq.errors import MessageCancelledError

    record = os.path.join(cluster.dir, "cancel-starts")
    cluster.start_workers(1, CANCEL_TOPIC, {"BENCH_UNTIL_CANCELLED": "1", "BENCH_BATCH": "1", "BENCH_TTR": "120",
                                            "BENCH_RECORD_FILE": record})
    client = cluster.client()
    try:
        samples, calls, seen = [], [], -CANCEL_EVERY
        for i in range(args.results_cancels):
            handle = client.produce(CANCEL_TOPIC, {"i": i}, result=True)
            deadline = time.monotonic() + 60
            while not any(start.id == handle.id for start in read_records(record)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the handler of message {handle.id} did not start")
                time.sleep(0.002)
            time.sleep(max(0.0, seen + CANCEL_EVERY - time.perf_counter()))  # past the keeper's limit
            began = time.perf_counter()
            if not handle.cancel(running=True):
                raise AssertionError(f"message {handle.id} was not running when cancelled")
            calls.append((time.perf_counter() - began) * 1000)
            try:
                handle.result(timeout=60)
                raise AssertionError(f"message {handle.id} ended without its cancel")
            except MessageCancelledError:
                seen = time.perf_counter()
                samples.append((seen - began) * 1000)
        lat = summarize(samples)
        report.record("results", "cancel(running=True) -> CANCELLED seen by a waiter", lat, "ms",
                      f"a handler reporting no progress; heartbeats every 40 s; cancels {CANCEL_EVERY:g} s apart")
        report.record("results", "the Cancel call alone", summarize(calls), "ms", "deletes NEW, marks RUNNING")
    finally:
        client.close()
        cluster.stop_workers()


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    _latency(cluster, report, args)
    _consume(cluster, report, args)
    _waiters(cluster, report, args)
    _cancel(cluster, report, args)
