"""produce: ``produce_many`` batches through one broker vs raw multi-row INSERTs; single-produce latency."""

from __future__ import annotations

import os
import threading
import time
from argparse import Namespace

from . import raw
from .env import Cluster, CpuMeter
from .profile import profiled
from .report import Report, summarize

__all__ = ["run"]


def _broker_rate(cluster: Cluster, report: Report, topic: str, total: int, threads: int, batch: int,
                 profile: str = "") -> tuple[float, CpuMeter]:
    client = cluster.client()
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


def _latency(cluster: Cluster, report: Report, topic: str, samples: int) -> list[float]:
    client = cluster.client()
    try:
        for i in range(20):  # warm the channel and the broker's caches
            client.produce(topic, {"warm": i})
        times = []
        for i in range(samples):
            began = time.perf_counter()
            client.produce(topic, {"i": i})
            times.append((time.perf_counter() - began) * 1000)
            if i % 100 == 0:
                report.progress(f"single produce() latency: {i:,}/{samples:,}")
        return times
    finally:
        client.close()


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    """Raw INSERT rate, broker produce rate, their ratio, then idle single-produce latency."""
    url = cluster.db_url
    n, threads, batch = args.produce_messages, args.produce_threads, args.produce_batch
    raw.truncate(url)
    report.progress(f"raw multi-row INSERT: {n:,} rows, {threads} connections x {batch} rows")
    raw_rate = raw.insert_rate(url, "bench.raw", n, threads, batch)
    report.record("produce", "raw INSERT (PyMySQL)", raw_rate, "msg/s", f"{threads} conns x {batch} rows/commit")
    raw.truncate(url)
    rate, cpu = _broker_rate(cluster, report, "bench.produce", n, threads, batch, args.profile)
    report.record("produce", "produce_many through 1 broker", rate, "msg/s", f"{threads} threads x {batch}/call")
    report.record("produce", "cpu s/s during produce", cpu.shares(), "cores")
    ratio = rate / raw_rate
    report.record("produce", "ratio broker / raw", round(ratio, 3), "x")
    report.target("produce", "ratio", round(ratio, 3), ">=", args.produce_target)
    raw.truncate(url)
    report.progress("raw single-row INSERT + COMMIT latency")
    floor = summarize(raw.commit_latency(url, "bench.rawlatency", args.latency_samples))
    report.record("produce", "raw 1-row INSERT+COMMIT latency", floor, "ms", "the durable floor (log flush)")
    lat = summarize(_latency(cluster, report, "bench.latency", args.latency_samples))
    report.record("produce", "single produce() latency", lat, "ms", "idle broker, one thread")
    report.record("produce", "p50 / p99 over the raw commit", f"{lat['p50'] / floor['p50']:.2f} / {lat['p99'] / floor['p99']:.2f}", "x")
    report.target("produce", "single produce() p99 ms", lat["p99"], "<=", 5.0)
    raw.truncate(url)
