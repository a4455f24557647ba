"""consume: due messages drained by worker processes vs the raw lock/read/mark loop; 2 brokers vs 1.

The messages are loaded as pending (due tomorrow) while the workers start, then made due in one
UPDATE: the workers are registered and long-polling when the clock starts. The rate is taken
from the times the brokers stored (first lock to last SUCCESS), so no process start-up is in it.
"""

from __future__ import annotations

import time
from argparse import Namespace
from datetime import timedelta

from tidemq_broker import clock

from . import raw
from .env import Cluster, CpuMeter
from .profile import profiled
from .report import Report

__all__ = ["run", "raw_rate", "workers_rate"]


def _load(cluster: Cluster, report: Report, topic: str, n: int, due_in: float) -> None:
    raw.truncate(cluster.db_url)
    when = clock.after(clock.now(), due_in)
    raw.load(cluster.db_url, topic, n, lambda i: when,
             progress=lambda k: report.progress(f"loading {topic}: {k:,}/{n:,}") if k % 20000 == 0 else None)


def raw_rate(cluster: Cluster, report: Report, n: int) -> float:
    _load(cluster, report, "bench.rawconsume", n, 0)
    report.progress(f"raw lock 500 / read / mark SUCCESS loop over {n:,} messages")
    return raw.consume_rate(cluster.db_url, "bench.rawconsume", n)


def workers_rate(cluster: Cluster, report: Report, n: int, workers: int, args: Namespace) -> tuple[float, float, CpuMeter]:
    """(rate from stored times, rate by the wall clock, cpu) of ``workers`` processes draining ``n``."""
    topic = f"bench.consume.w{workers}.b{len(cluster.brokers)}"
    _load(cluster, report, topic, n, 86400)
    procs = cluster.start_workers(workers, topic, {"BENCH_THREADS": str(args.worker_threads),
                                                   "BENCH_BATCH": str(args.worker_batch)})
    pids = {"brokers": [b.pid for b in cluster.brokers], "workers": [p.pid for p in procs],
            "mariadb": [cluster.mariadb.proc.pid]}
    try:
        with CpuMeter(pids) as cpu, profiled(args.profile, topic, {k: v for k, v in pids.items() if k != "mariadb"}):
            raw.make_due(cluster.db_url, topic)
            began = time.monotonic()
            deadline = began + max(120.0, n / 500)
            while True:
                done = raw.count(cluster.db_url, topic, "SUCCESS")
                report.progress(f"{workers} workers, {len(cluster.brokers)} broker(s): {done:,}/{n:,} done")
                if done >= n:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{workers} workers finished only {done:,} of {n:,} messages")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.2)
            wall = time.monotonic() - began
    finally:
        cluster.stop_workers()
    seconds, done = raw.span(cluster.db_url, topic)
    return done / seconds, n / wall, cpu


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    n = args.consume_messages
    base = raw_rate(cluster, report, n)
    report.record("consume", "raw lock/read/mark loop", base, "msg/s", "1 connection, 500 per lock")
    results = {}
    for workers in args.consume_workers:
        rate, wall_rate, cpu = workers_rate(cluster, report, n, workers, args)
        results[workers] = rate
        report.record("consume", f"{workers} worker processes, 1 broker", rate, "msg/s",
                      f"wall clock incl. wake-up: {wall_rate:,.0f}/s")
        report.record("consume", f"cpu s/s with {workers} workers", cpu.shares(), "cores")
        ratio = round(rate / base, 3)
        report.record("consume", f"ratio {workers} workers / raw", ratio, "x")
        report.target("consume", f"ratio {workers} workers", ratio, ">=", args.consume_target)
        if args.e2e_target and workers == 2:
            report.target("consume", "2 workers msg/s", round(rate), ">=", args.e2e_target)
    if args.scale:
        workers = max(args.consume_workers)
        cluster.start_broker()
        try:
            rate, wall_rate, cpu = workers_rate(cluster, report, n, workers, args)
        finally:
            extra = cluster.brokers.pop()
            extra.stop()
        report.record("scale", f"{workers} workers, 2 brokers", rate, "msg/s", f"wall: {wall_rate:,.0f}/s")
        report.record("scale", "ratio 2 brokers / 1 broker", round(rate / results[workers], 3), "x")
        report.record("scale", "cpu s/s with 2 brokers", cpu.shares(), "cores",
                      "2 cores: brokers + workers + mariadb share them")
    raw.truncate(cluster.db_url)
