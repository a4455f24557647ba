"""consume: due messages drained by worker processes vs the raw lock/read/mark loop; 2 brokers vs 1.

For each worker count the workers start once and stay registered; then ``--rounds`` times, in
alternating order, the raw loop drains a fresh slice of due messages and the workers drain a
slice loaded as pending (due tomorrow) and made due in one UPDATE, so they are long-polling when
the clock starts. The workers' time is taken from the times the brokers stored (first lock to
last SUCCESS), so no process start-up or wake-up is in it. Rates are total messages over total
time of each side, so load drifting on a shared machine shifts both alike.
"""

from __future__ import annotations

import time
from argparse import Namespace

from tidemq import clock

from . import raw
from .env import Cluster, CpuMeter, Proc
from .profile import profiled
from .report import Report

__all__ = ["run", "compare"]

RAW_TOPIC = "bench.rawconsume"


def _load(cluster: Cluster, report: Report, topic: str, n: int, due_in: float) -> None:
    raw.truncate(cluster.db_url)
    when = clock.after(clock.now(), due_in)
    raw.load(cluster.db_url, topic, n, lambda i: when,
             progress=lambda k: report.progress(f"loading {topic}: {k:,}/{n:,}") if k % 20000 == 0 else None)


def _raw_seconds(cluster: Cluster, report: Report, n: int, label: str) -> float:
    _load(cluster, report, RAW_TOPIC, n, 0)
    report.progress(f"{label}: raw lock 500 / read / mark SUCCESS over {n:,}")
    return n / raw.consume_rate(cluster.db_url, RAW_TOPIC, n)


def _workers_seconds(cluster: Cluster, report: Report, topic: str, n: int, procs: list[Proc], label: str,
                     cpu: CpuMeter, profile: str, least_rate: float = 500) -> tuple[float, float]:
    """(seconds by the stored times, seconds by the wall clock) for the workers to drain ``n``;
    it fails after 120 s or ``n / least_rate`` s, whichever is longer."""
    _load(cluster, report, topic, n, 86400)
    watch = raw.Watch(cluster.db_url)
    try:
        with cpu, profiled(profile, f"{topic}-{len(cluster.brokers)}b",
                           {k: v for k, v in cpu.pids.items() if k != "mariadb"}):
            raw.make_due(cluster.db_url, topic)
            began = time.monotonic()
            deadline = began + max(120.0, n / least_rate)
            shown = 0.0
            while watch.unfinished(topic):
                now = time.monotonic()
                if now - shown > 5.0:  # counting scans the topic's rows: rarely, so it does not slow the run
                    done = watch.count(topic, "SUCCESS")
                    report.progress(f"{label}: {len(procs)} workers, {len(cluster.brokers)} broker(s): {done:,}/{n:,}")
                    shown = now
                if now > deadline:
                    raise TimeoutError(f"{len(procs)} workers did not finish {n:,} messages in time")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.1)
            wall = time.monotonic() - began
    finally:
        watch.close()
    seconds, done = raw.span(cluster.db_url, topic)
    if done != n:
        raise AssertionError(f"{done} of {n} messages are SUCCESS")
    return seconds, wall


def compare(cluster: Cluster, report: Report, workers: int, args: Namespace) -> dict:
    """Workers vs raw over ``--rounds`` interleaved slices; rates, ratio and CPU shares."""
    n, rounds = args.consume_messages, args.rounds
    per = n // rounds
    topic = f"bench.consume.w{workers}.b{len(cluster.brokers)}"
    procs = cluster.start_workers(workers, topic, {"BENCH_THREADS": str(args.worker_threads),
                                                   "BENCH_BATCH": str(args.worker_batch)})
    pids = {"brokers": [b.pid for b in cluster.brokers], "workers": [p.pid for p in procs],
            "mariadb": [cluster.mariadb.proc.pid]}
    raw_s = ours_s = wall_s = 0.0
    cpu_total: dict[str, float] = {}
    try:
        for r in range(rounds):
            label = f"round {r + 1}/{rounds}"
            for step in (("raw", "ours") if r % 2 == 0 else ("ours", "raw")):
                if step == "raw":
                    raw_s += _raw_seconds(cluster, report, per, label)
                    continue
                cpu = CpuMeter(pids)
                seconds, wall = _workers_seconds(cluster, report, topic, per, procs, label, cpu,
                                                 args.profile if r == 0 else "")
                ours_s += seconds
                wall_s += wall
                for k, v in cpu.seconds.items():
                    cpu_total[k] = cpu_total.get(k, 0.0) + v
    finally:
        cluster.stop_workers()
        raw.truncate(cluster.db_url)
    return {"raw": per * rounds / raw_s, "rate": per * rounds / ours_s, "wall": per * rounds / wall_s,
            "cpu": {k: round(v / wall_s, 2) for k, v in cpu_total.items()}}


def defaults_rate(cluster: Cluster, report: Report, workers: int, n: int) -> float:
    """msg/s of ``workers`` workers whose consumer is declared with no options at all
    (``@mq_consumer(topic)``, as a new user writes it), draining ``n`` due messages."""
    topic = f"bench.consume.defaults.w{workers}"
    procs = cluster.start_workers(workers, topic, {"BENCH_DEFAULTS": "1"})
    pids = {"brokers": [b.pid for b in cluster.brokers], "workers": [p.pid for p in procs],
            "mariadb": [cluster.mariadb.proc.pid]}
    try:
        # At its defaults a worker may be many times slower than as set here: a longer deadline.
        seconds, _ = _workers_seconds(cluster, report, topic, n, procs, "consumer defaults", CpuMeter(pids), "", 50)
    finally:
        cluster.stop_workers()
        raw.truncate(cluster.db_url)
    return n / seconds


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    results = {}
    for k, workers in enumerate(args.consume_workers):
        res = results[workers] = compare(cluster, report, workers, args)
        report.record("consume", f"raw loop (beside {workers} workers)", res["raw"], "msg/s",
                      "1 connection, 500 per lock")
        report.record("consume", f"{workers} worker processes, 1 broker", res["rate"], "msg/s",
                      f"wall clock incl. wake-up: {res['wall']:,.0f}/s")
        report.record("consume", f"cpu s/s with {workers} workers", res["cpu"], "cores")
        ratio = round(res["rate"] / res["raw"], 3)
        report.record("consume", f"ratio {workers} workers / raw", ratio, "x", f"{args.rounds} interleaved rounds")
        report.target("consume", f"ratio {workers} workers", ratio, ">=", args.consume_target)
        if args.e2e_target and workers == 2:
            report.target("consume", "2 workers msg/s", round(res["rate"]), ">=", args.e2e_target)
        if k == 0 and args.consume_defaults_messages:
            rate = report.record("consume", f"{workers} worker processes, consumer defaults",
                                 defaults_rate(cluster, report, workers, args.consume_defaults_messages), "msg/s",
                                 f"@mq_consumer(topic) with no options, {args.consume_defaults_messages:,} messages")
            report.record("consume", f"ratio consumer defaults / as set here ({workers} workers)",
                          round(rate / res["rate"], 3), "x",
                          f"threads {args.worker_threads}, batch {args.worker_batch}")
    if args.scale:
        workers = max(args.consume_workers)
        cluster.start_broker()
        try:
            res = compare(cluster, report, workers, args)
        finally:
            extra = cluster.brokers.pop()
            extra.stop()
        one = results[workers]
        report.record("scale", f"{workers} workers, 2 brokers", res["rate"], "msg/s", f"wall: {res['wall']:,.0f}/s")
        report.record("scale", "raw loop (beside 2 brokers)", res["raw"], "msg/s")
        report.record("scale", "ratio to raw: 2 brokers / 1 broker",
                      f"{res['rate'] / res['raw']:.3f} / {one['rate'] / one['raw']:.3f}", "x")
        report.record("scale", "cpu s/s with 2 brokers", res["cpu"], "cores", "vs 1 broker: " +
                      " ".join(f"{k}={v}" for k, v in one["cpu"].items()))
