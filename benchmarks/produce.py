"""produce: ``produce_many`` batches through one broker vs raw multi-row INSERTs; single-produce latency."""

from __future__ import annotations

import os
import threading
import time
from argparse import Namespace
from typing import Optional

from . import raw, rpc_floor
from .env import Cluster, CpuMeter
from .profile import profiled
from .report import Report, summarize

__all__ = ["run"]


def _broker_rate(cluster: Cluster, report: Report, topic: str, total: int, threads: int, batch: int,
                 profile: str = "", client_env: Optional[dict[str, str]] = None) -> tuple[float, CpuMeter]:
    """msg/s of ``produce_many`` from ``threads`` threads (a client of the cluster, or one made
    from ``client_env`` on top of the cluster's settings, e.g. pinned to one broker)."""
    if client_env is None:
        client = cluster.client()
    else:
        from tidemq import Client, Settings

        client = Client(Settings.from_env(env={**cluster.settings_env, **client_env}))
    try:
        client.produce_many(topic, [{"warm": i} for i in range(batch)])  # channel, topic row, caches
        per_thread = total // threads // batch * batch
        datas = [[{"i": k * per_thread + j, "body": "benchmark-payload-" + "x" * 24} for j in range(per_thread)]
                 for k in range(threads)]
        done = [0] * threads
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads + 1)

        def run(k: int) -> None:
            try:
                barrier.wait()
                mine = datas[k]
                for start in range(0, per_thread, batch):
                    client.produce_many(topic, mine[start : start + batch])
                    done[k] += batch
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        pids = {"broker": [b.pid for b in cluster.brokers], "mariadb": [cluster.mariadb.proc.pid],
                "bench client": [os.getpid()]}
        with CpuMeter(pids) as cpu, profiled(profile, "produce", {k: v for k, v in pids.items() if k != "mariadb"}):
            barrier.wait()
            began = time.perf_counter()
            for w in workers:
                while w.is_alive():
                    report.progress(f"produce through the broker: {sum(done):,}/{per_thread * threads:,}")
                    w.join(0.25)
            elapsed = time.perf_counter() - began
        if errors:
            raise errors[0]
        return per_thread * threads / elapsed, cpu
    finally:
        client.close()


def _latency(cluster: Cluster, report: Report, topic: str, samples: int, path: str = "",
             gap: float = 0.0) -> list[float]:
    client = cluster.client(path=path)
    try:
        for i in range(20):  # warm the channel and the broker's caches
            client.produce(topic, {"warm": i})
        times = []
        for i in range(samples):
            began = time.perf_counter()
            client.produce(topic, {"i": i})
            times.append((time.perf_counter() - began) * 1000)
            if gap:
                time.sleep(gap)
        return times
    finally:
        client.close()


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    """Raw INSERT rate vs broker produce rate, then idle single-produce latency vs a raw commit.

    The raw and broker measurements alternate in ``--rounds`` slices (raw first in even rounds,
    broker first in odd ones) and each rate is total messages over total time: a machine whose
    load drifts during the run shifts both sides alike instead of skewing the ratio.
    """
    url = cluster.db_url
    n, threads, batch, rounds = args.produce_messages, args.produce_threads, args.produce_batch, args.rounds
    per = n // rounds // (threads * batch) * threads * batch
    raw.truncate(url)
    raw_s = ours_s = 0.0
    cpu_seconds: dict[str, float] = {}
    for r in range(rounds):
        for step in (("raw", "broker") if r % 2 == 0 else ("broker", "raw")):
            if step == "raw":
                report.progress(f"round {r + 1}/{rounds}: raw multi-row INSERT of {per:,} rows")
                raw_s += per / raw.insert_rate(url, "bench.raw", per, threads, batch)
            else:
                rate, cpu = _broker_rate(cluster, report, "bench.produce", per, threads, batch,
                                         args.profile if r == 0 else "")
                ours_s += per / rate
                for k, v in cpu.seconds.items():
                    cpu_seconds[k] = cpu_seconds.get(k, 0.0) + v
    raw_rate, rate = per * rounds / raw_s, per * rounds / ours_s
    report.record("produce", "raw INSERT (PyMySQL)", raw_rate, "msg/s", f"{threads} conns x {batch} rows/commit")
    report.record("produce", "produce_many through 1 broker", rate, "msg/s", f"{threads} threads x {batch}/call")
    report.record("produce", "cpu s/s during produce", {k: round(v / ours_s, 2) for k, v in cpu_seconds.items()},
                  "cores")
    ratio = round(rate / raw_rate, 3)
    report.record("produce", "ratio broker / raw", ratio, "x", f"{rounds} interleaved rounds")
    report.target("produce", "ratio", ratio, ">=", args.produce_target)
    raw.truncate(url)
    floor: list[float] = []
    ours: list[float] = []
    unary: list[float] = []
    step = max(1, args.latency_samples // 10)
    for k in range(0, args.latency_samples, step):  # interleaved blocks, for the same reason
        report.progress(f"single produce() latency: {k:,}/{args.latency_samples:,}")
        floor += raw.commit_latency(url, "bench.rawlatency", step)
        ours += _latency(cluster, report, "bench.latency", step)
        unary += _latency(cluster, report, "bench.latency", step, path="unary")
    floor_s, lat, unary_s = summarize(floor), summarize(ours), summarize(unary)
    report.record("produce", "raw 1-row INSERT+COMMIT latency", floor_s, "ms", "the durable floor (log flush)")
    report.record("produce", "single produce() latency", lat, "ms", "idle broker, one thread, on a produce stream")
    report.record("produce", "single produce() latency, unary calls", unary_s, "ms", "TIDEMQ_PRODUCE=unary")
    report.record("produce", "p50 / p99 over the raw commit",
                  f"{lat['p50'] / floor_s['p50']:.2f} / {lat['p99'] / floor_s['p99']:.2f}", "x")
    report.record("produce", "p50 stream / unary", round(lat["p50"] / unary_s["p50"], 3), "x")
    call_times, stream_times = rpc_floor.latency(args.latency_samples)
    rpc, streamed = summarize(call_times), summarize(stream_times)
    report.record("produce", "empty gRPC call latency", rpc, "ms", "Python server that writes nothing")
    report.record("produce", "empty request on an open stream latency", streamed, "ms", "the same server")
    report.record("produce", "raw commit + empty stream request, p50", round(floor_s["p50"] + streamed["p50"], 3), "ms",
                  "what one produce() cannot beat")
    report.target("produce", "single produce() p50 / raw commit p50", round(lat["p50"] / floor_s["p50"], 3), "<=", 1.5)
    report.target("produce", "single produce() p99 ms", lat["p99"], "<=", 5.0)
    _after_idle(cluster, report, url, args.latency_samples // 4, args.idle_gap_ms / 1000)
    raw.truncate(url)


def _after_idle(cluster: Cluster, report: Report, url: str, samples: int, gap: float) -> None:
    """The same two calls, each after ``gap`` seconds of nothing: what a caller that produces now
    and then waits, not one calling back to back. Every thread on the way (client, gRPC, broker,
    MariaDB) has gone to sleep and every hop pays a wake-up, so both figures grow; their ratio
    says what the call costs a caller that is not a loop."""
    floor: list[float] = []
    ours: list[float] = []
    step = max(1, samples // 4)
    for k in range(0, samples, step):
        report.progress(f"single produce() latency after {gap * 1000:g} ms idle: {k:,}/{samples:,}")
        n = min(step, samples - k)
        floor += raw.commit_latency(url, "bench.rawlatency", n, gap)
        ours += _latency(cluster, report, "bench.latency", n, gap=gap)
    floor_s, lat = summarize(floor), summarize(ours)
    note = f"{gap * 1000:g} ms of nothing before each"
    report.record("produce", "raw 1-row INSERT+COMMIT latency after idle", floor_s, "ms", note)
    report.record("produce", "single produce() latency after idle", lat, "ms", note)
    report.record("produce", "after idle: p50 over the raw commit's", round(lat["p50"] / floor_s["p50"], 3), "x")
