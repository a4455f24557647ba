"""delay accuracy: how late due messages run, with and without a million pending, and what the
pending ones cost in broker and worker memory.

Phase 1 (nothing pending): ``--peer-due`` messages due over ``--peer-window`` seconds, the
same load the peers get, so the two lateness rows compare like with like. The broker's
and workers' RSS after it is the "with none" figure.
Phase 2: ``--pending`` messages due over the next hours are loaded, then ``--due`` messages
due within ``--due-window`` seconds are produced through the broker; lateness is what each
handler saw (now - effect_time), and RSS is read again.
"""

from __future__ import annotations

import os
import threading
import time
from argparse import Namespace
from datetime import datetime, timedelta

from tidemq import clock

from . import raw
from .env import Cluster, Proc, rss_mb
from .lateness_log import LatenessFiles
from .report import Report, summarize

__all__ = ["run", "produce_spread"]

TOPIC = "bench.delay"


def produce_spread(cluster: Cluster, count: int, first: datetime, window: float, threads: int = 4,
                   per_call: int = 10) -> None:
    """Produce ``count`` messages through the broker, effect times spread evenly over
    [first, first + window], ``per_call`` sharing each time, earliest first."""
    client = cluster.client()
    calls = [(k, min(per_call, count - k)) for k in range(0, count, per_call)]
    errors: list[BaseException] = []

    def run(mine: list[tuple[int, int]]) -> None:
        try:
            for k, n in mine:
                when = first + timedelta(seconds=window * k / max(count, 1))
                client.produce_many(TOPIC, [{"i": k + j} for j in range(n)], effect_time=_aware(when))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(calls[t::threads],)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    client.close()
    if errors:
        raise errors[0]


def _aware(naive_utc: datetime) -> datetime:
    from datetime import timezone

    return naive_utc.replace(tzinfo=timezone.utc)


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    raw.truncate(cluster.db_url)
    prefix = os.path.join(cluster.dir, "lateness")
    procs = cluster.start_workers(args.delay_workers, TOPIC, {
        "BENCH_THREADS": "4", "BENCH_BATCH": "100", "BENCH_LATENESS_FILE": prefix})
    broker = cluster.brokers[0]
    try:
        marks = LatenessFiles(prefix)
        late0 = _run_phase(cluster, report, marks, args.peer_due, args.peer_window, procs, "no pending")
        rss0 = {"broker": rss_mb(broker.pid), "workers": sum(rss_mb(p.pid) for p in procs)}
        _targets(report, "none pending",
                 _record(report, f"{args.peer_due} due over {args.peer_window:.0f}s, none pending", late0))
        pending_from = clock.after(clock.now(), 3600)
        span = 5 * 3600 / max(args.pending, 1)
        raw.load(cluster.db_url, TOPIC, args.pending, lambda i: pending_from + timedelta(seconds=i * span),
                 progress=lambda k: (report.progress(f"loading {k:,}/{args.pending:,} pending")
                                     if k % 50000 == 0 else None))
        late1 = _run_phase(cluster, report, marks, args.due, args.due_window, procs, f"{args.pending:,} pending")
        rss1 = {"broker": rss_mb(broker.pid), "workers": sum(rss_mb(p.pid) for p in procs)}
        name = f"{args.due} due over {args.due_window:.0f}s, {args.pending} pending"
        _targets(report, "pending", _record(report, name, late1))
        report.target("delay", "early deliveries", float(sum(1 for v in late1 + late0 if v < 0)), "<=", 0.0)
        for who in ("broker", "workers"):
            report.record("delay", f"{who} RSS MiB none / pending", f"{rss0[who]:.1f} / {rss1[who]:.1f}", "MiB")
            report.target("delay", f"{who} RSS ratio", round(rss1[who] / rss0[who], 3), "<=", 1.2)
    finally:
        cluster.stop_workers()
        raw.truncate(cluster.db_url)


def _run_phase(cluster: Cluster, report: Report, marks: LatenessFiles, count: int, window: float,
               procs: list[Proc], label: str) -> list[float]:
    first = clock.after(clock.now(), 3.0 + count / 4000)  # producing must finish before the first is due
    report.progress(f"{label}: producing {count:,} due over {window:.0f} s")
    produce_spread(cluster, count, first, window)
    deadline = time.monotonic() + (first - clock.now()).total_seconds() + window + 60
    while True:
        values = marks.new()
        report.progress(f"{label}: {len(values):,}/{count:,} run")
        if len(values) >= count:
            marks.commit()
            return values
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: only {len(values):,} of {count:,} due messages ran")
        for proc in procs:
            proc.check_alive()
        time.sleep(0.5)


def _targets(report: Report, label: str, stats: dict) -> None:
    """The lateness targets, for one phase."""
    report.target("delay", f"lateness p50 ms ({label})", stats["p50"], "<=", 2.0)
    report.target("delay", f"lateness p99 ms ({label})", stats["p99"], "<=", 10.0)
    report.target("delay", f"lateness max ms ({label})", stats["max"], "<=", 50.0)


def _record(report: Report, name: str, values: list[float]) -> dict:
    stats = summarize(values)
    report.record("delay", f"tidemq lateness: {name}", stats, "ms")
    return stats
