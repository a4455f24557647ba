"""pressure: a steady offered load while the database, ZooKeeper or tidemq's own processes are
under the pressures of a shared production system; how much slower, for how long, and whether
anything is lost or run twice.

Each pressure (``--pressures``) gets fresh servers (MariaDB with ``--pressure-max-connections``,
ZooKeeper), 2 brokers and 2 workers (8 handler threads, ttr 10 s, a 1 ms handler). The capacity
is measured once, on the first pressure's cluster: ``produce_many`` calls of the phases' own shape
(``--pressure-batch`` messages from ``--pressure-senders`` threads) at full speed for
``--capacity-seconds`` while the workers consume; the completion rate is the capacity. Calls of
100 from 4 threads, cheaper per message, are measured beside it for reference.
Then, per pressure, an open-loop producer offers ``--offered-fraction`` of it (``--offered``
overrides) in ``produce_many`` batches, beside a few delayed messages a second, through four
phases: warmup, clean, stress (the pressure is on), recovery. Figures: benchmarks/pressure_stats.py;
rows and targets: benchmarks/pressure_report.py; the method: docs/RELIABILITY.md.
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from argparse import Namespace
from datetime import datetime, timedelta
from typing import Optional

from tidemq import clock

from . import gc_pauses, pressure_report, raw
from .openloop import Call, DelayedProducer, OpenLoopProducer
from .pressure_env import HistorySampler, PressureCluster, connect, logs_to_file
from .pressure_stats import (Phase, Row, depth_series, drain_seconds, duplicates, first_starts, phase_figures,
                             pace_seconds, percentile_ms, read_records, recovery_seconds,
                             remove_records, window_rate)
from .pressures import KINDS, Pressure, make
from .report import Report

__all__ = ["run", "KINDS", "DEFAULT_PRESSURES"]

TOPIC = "bench.pressure"
S = "pressure"
DEFAULT_PRESSURES = [k for k in KINDS if k != "idle-view-10m"]
_EPOCH = datetime(1970, 1, 1)


def run(cluster: object, report: Report, args: Namespace) -> None:
    """Every pressure of ``--pressures`` on its own fresh cluster (the suite's shared one is not
    used: these pressures stop, kill and fill servers)."""
    capacity: Optional[float] = args.capacity or None
    results, failed = [], []
    for kind in args.pressures:
        try:
            result = _one(kind, capacity, report, args)
        except Exception as exc:  # one broken run must not hide the other pressures' figures
            failed.append(kind)
            report.record(S, f"{kind}: failed", f"{type(exc).__name__}: {exc}")
            continue
        capacity = capacity or result["capacity"]
        results.append(result)
        pressure_report.record(report, result, args)
    pressure_report.summary(report, results)
    if failed:
        raise RuntimeError(f"pressure runs failed: {', '.join(failed)} (see the table)")


def _worker_env(args: Namespace) -> dict[str, str]:
    return {"BENCH_THREADS": str(args.pressure_threads), "BENCH_BATCH": str(args.pressure_worker_batch),
            "BENCH_TTR": str(args.pressure_ttr), "BENCH_SLEEP_MS": str(args.handler_ms)}


def _one(kind: str, capacity: Optional[float], report: Report, args: Namespace) -> dict:
    report.progress(f"pressure {kind}: starting fresh servers, {args.pressure_brokers} brokers, "
                    f"{args.pressure_workers} workers")
    load = os.getloadavg()[0]
    options = (*args.mariadb_options, f"--max-connections={args.pressure_max_connections}")
    cluster = PressureCluster(options, TOPIC, _worker_env(args))
    prefix = os.path.join(cluster.dir, "starts")
    cluster.worker_env["BENCH_RECORD_FILE"] = prefix
    cluster.process_env.update(gc_pauses.env(os.path.join(cluster.dir, "gc")))
    with logs_to_file(os.path.join(cluster.dir, "bench-clients.log")):
        result = _measure(kind, capacity, cluster, prefix, load, report, args)
    if not _findings(result):  # a run that failed (raised) keeps its directory too
        shutil.rmtree(cluster.dir, ignore_errors=True)
        result["logs"] = ""
    return result


def _findings(result: dict) -> list[str]:
    """What in a pressure's outcome is worth reading its processes' and servers' logs for:
    every run leaves a directory of them, tens of MB, and a run that found nothing to explain
    does not keep it."""
    found = [k for k in ("lost", "dup", "unfinished", "not success", "never started", "over deadline", "exited")
             if result[k]]
    return found + (["stack stop killed"] if "killed" in result["stack stop"].values() else [])


def _measure(kind: str, capacity: Optional[float], cluster: PressureCluster, prefix: str, load: float,
             report: Report, args: Namespace) -> dict:
    producer = delayed = history = None
    pressure: Optional[Pressure] = None
    stopped = completed = False
    try:
        if args.preload:
            _preload(cluster, report, args.preload)
        cluster.start_all(args.pressure_brokers, args.pressure_workers)
        measured = capacity is None
        bulk: Optional[float] = None
        if capacity is None:
            # The base is what the phases' own calls reach: calls of 100 cost the cores less
            # per message, and half of their rate was about 70 % of what calls of 10 reach.
            capacity = _capacity(cluster, report, args, args.pressure_senders, args.pressure_batch)
            bulk = _capacity(cluster, report, args, 4, 100)
        first_id = _max_id(cluster) + 1  # the capacity run's messages are not the phases'
        offered = args.offered or args.offered_fraction * capacity
        history = HistorySampler(cluster.port).start()
        producer = OpenLoopProducer(cluster.client, TOPIC, offered, args.pressure_batch, args.pressure_senders)
        delayed = DelayedProducer(cluster.client(), TOPIC, args.delayed_rate)
        pressure = make(kind, cluster, producer, capacity, args)
        stress = args.idle_long_seconds if kind == "idle-view-10m" else args.stress_seconds
        logs: dict[str, int] = {}

        producer.start()
        delayed.start()
        t0, cpu0 = time.time(), time.process_time()
        t1 = _until(report, t0 + args.warmup_seconds, f"pressure {kind}: warmup at {offered:,.0f}/s")
        logs["clean"] = cluster.log_lines()
        t2 = _until(report, t1 + args.clean_seconds, f"pressure {kind}: clean phase")
        logs["stress"] = cluster.log_lines()
        pressure.start()
        _until(report, t2 + stress, f"pressure {kind}: stress ({KINDS[kind]})")
        report.progress(f"pressure {kind}: ending the pressure")
        pressure.stop()
        stopped = True
        # Recovery starts once the pressure is gone (a killed broker's replacement is up); a
        # restarted server's fault ended earlier, when it answered again.
        t3 = time.time()
        fault_end = pressure.fault_end or t3
        logs["recovery"] = cluster.log_lines()
        # The overload leaves (overload - capacity) x stress seconds of calls behind, which drain
        # at (capacity - offered): at 1.5 x and half the capacity, as long as the stress phase
        # lasted even at full capacity, so a recovery as long as the stress could not show it.
        recovery = args.overload_recovery_seconds if kind == "overload" else args.recovery_seconds
        t4 = _until(report, t3 + recovery, f"pressure {kind}: recovery")
        logs["end"] = cluster.log_lines()
        bench_cpu = round((time.process_time() - cpu0) / (t4 - t0), 2)
        unsent = producer.stop(30)
        delayed.stop(15)
        exited = cluster.exited()
        unfinished = _drain(cluster, report, kind, args.drain_seconds)
        if cluster.mariadb.proc.poll() is not None:
            raise RuntimeError(f"MariaDB exited with {cluster.mariadb.proc.returncode} during the run; "
                               f"its log will be {cluster.dir}/mariadb-error.txt")
        history.stop()
        rows = _rows(cluster, first_id)
        starts = read_records(prefix)
        killed = dict(cluster.killed)
        completed = True
    finally:
        # A worker may take its drain timeout (30 s by default) to stop; torn down by an error or
        # a signal, nothing is measured any more, so nothing waits long.
        grace = 35.0 if completed else 3.0
        if pressure is not None and not stopped:
            pressure.abort()
        for part in (producer, delayed):
            if part is not None:
                part.stop(grace / 3)
        if history is not None:
            history.stop()
        stack_stop = cluster.stop_stack(grace)
        cluster.cleanup(keep_logs=True)  # removed by _one once the outcome found nothing in them
        gc.unfreeze()  # what the run kept can be collected once it is dropped
    remove_records(prefix)  # tens of MB per run; the logs stay in the run's directory

    phases = [Phase("warmup", t0, t1), Phase("clean", t1, t2), Phase("stress", t2, t3), Phase("recovery", t3, t4)]
    calls: list[Call] = producer.calls + delayed.calls
    first = first_starts(s for s in starts if s.id >= first_id)
    finishes = sorted(r.finish for r in rows if r.finish is not None)
    depth = depth_series(rows, first, t0, t4)
    figures = {p.name: phase_figures(p, calls, rows, finishes, first, depth, history.samples) for p in phases}
    hist = {int(t - t0): h for t, h in history.samples}
    # Second by second (from the warmup's start): completions, queue depth, history length.
    series = [[int(t - t0), round(window_rate(finishes, t, t + 1)), d, hist.get(int(t - t0))] for t, d in depth]
    clean = figures["clean"]
    acked = {i for c in calls for i in c.ids}
    by_id = {r.id: r for r in rows}
    dups = duplicates((s for s in starts if s.id >= first_id), killed)
    late = [s.at - s.effect for s in first.values() if s.kind == "d"]
    return {
        "kind": kind, "capacity": capacity, "capacity measured": measured, "capacity bulk": bulk,
        "offered": offered, "load": load,
        "phases": figures, "fault end": round(fault_end - t3, 1), "stress s": round(t3 - t2, 1),
        "lateness": {"count": len(late), "p99": percentile_ms(late, 99), "max": percentile_ms(late, 100),
                     "early": sum(1 for v in late if v < 0)},
        "recovery s": recovery_seconds(finishes, fault_end, t4, clean["done"], args.recovered_fraction),
        "drain s": drain_seconds(depth, fault_end, clean["depth max"] or 0),
        "pace s": pace_seconds(first, fault_end, t4, 2 * (clean["claim p99"] or 0) / 1000 + 0.020),
        "recovery window": round(t4 - fault_end, 1),
        "lost": len(acked - by_id.keys()),
        "unfinished": unfinished, "not success": sum(1 for i in acked if i in by_id and by_id[i].status != "SUCCESS"),
        "never started": sum(1 for r in rows if r.status == "SUCCESS" and r.id not in first),
        "dup": len(dups.unexcused), "dup same process": len(dups.same_process), "dup excused": len(dups.excused),
        "dup where": dict(list(dups.where.items())[:5]),
        "redelivered": sum(1 for r in rows if r.attempt > 1),
        "unsent": unsent, "over deadline": sum(1 for c in calls if c.done and c.latency > args.deadline_seconds),
        "exited": exited, "pressure": pressure.counts,
        "log lines": {"clean": logs["stress"] - logs["clean"], "stress": logs["recovery"] - logs["stress"],
                      "recovery": logs["end"] - logs["recovery"]},
        "stack stop s": (f"> {grace:g} (killed)" if "killed" in stack_stop.values()
                         else max(stack_stop.values(), default=0.0)),
        "gc": gc_pauses.summary(gc_pauses.read(os.path.join(cluster.dir, "gc")), t1, t4),
        "stack stop": stack_stop, "bench cpu": bench_cpu, "series": series, "load end": os.getloadavg()[0],
        "logs": cluster.dir,
    }


def _until(report: Report, when: float, label: str) -> float:
    """Sleep until ``when`` (epoch s), showing a countdown; returns ``when``."""
    while True:
        left = when - time.time()
        if left <= 0:
            return when
        report.progress(f"{label}: {left:,.0f} s left")
        # The calls and records kept so far stay until the run ends: out of the cycle
        # collector's walks, or its full collections (40-100 ms in this process by the clean
        # phase, GIL held) land between a call's send stamp and its send, and count as claim.
        gc.freeze()
        time.sleep(min(1.0, left))


def _capacity(cluster: PressureCluster, report: Report, args: Namespace, senders: int, batch: int) -> float:
    """Completions per second while ``senders`` threads call ``produce_many`` (``batch`` each) at
    full speed and the workers consume, over the run but its first quarter (at most 2 s); then
    the backlog left is deleted so the phases start from an empty queue."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def flood() -> None:
        client = cluster.client()
        try:
            while not stop.is_set():
                client.produce_many(TOPIC, [{"t": round(time.time(), 6), "k": "c"}] * batch)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=flood, name="bench-capacity", daemon=True) for _ in range(senders)]
    began = time.time()
    for t in threads:
        t.start()
    try:
        _until(report, began + args.capacity_seconds,
               f"pressure: measuring capacity, calls of {batch} from {senders} threads")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    end = time.time()
    if errors:
        raise errors[0]
    warm = min(2.0, args.capacity_seconds / 4)
    conn = connect(cluster.port)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM tidemq_message WHERE topic = %s AND status = 'SUCCESS' "
                        "AND finish_time >= %s AND finish_time < %s",
                        (TOPIC, _moment(began + warm), _moment(end)))
            done = int(cur.fetchone()[0])
            cur.execute("DELETE FROM tidemq_message WHERE topic = %s AND status = 'NEW'", (TOPIC,))
    finally:
        conn.close()
    _drain(cluster, report, "capacity", 60)
    return done / (end - began - warm)


def _preload(cluster: PressureCluster, report: Report, rows: int) -> None:
    """``rows`` messages of another topic, due in 30 days and more: a table the size of a
    production one, which a dump or a scan takes long to read (the phases' topic is not in it)."""
    base = clock.after(clock.now(), 30 * 86400)
    raw.load(cluster.root_url, "bench.preload", rows, lambda i: base + timedelta(seconds=i),
             progress=lambda k: report.progress(f"preloading {k:,}/{rows:,} rows") if k % 50_000 == 0 else None)


def _max_id(cluster: PressureCluster) -> int:
    conn = connect(cluster.port)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COALESCE(MAX(id), 0) FROM tidemq_message")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _drain(cluster: PressureCluster, report: Report, kind: str, seconds: float) -> int:
    """Wait up to ``seconds`` for every message to finish (expired leases come back after the
    ttr); returns how many are still NEW or RUNNING then."""
    deadline = time.time() + seconds
    left = -1
    while True:
        try:
            conn = connect(cluster.port)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT COUNT(*) FROM tidemq_message WHERE topic = %s AND status IN ('NEW', 'RUNNING')",
                                (TOPIC,))
                    left = int(cur.fetchone()[0])
            finally:
                conn.close()
        except Exception:
            left = -1  # the server is not back yet: keep waiting
        if left == 0 or time.time() > deadline or cluster.mariadb.proc.poll() is not None:
            return left
        report.progress(f"pressure {kind}: {left:,} messages still to finish")
        time.sleep(0.5)


def _moment(epoch: float) -> datetime:
    return clock.from_epoch_ms(int(epoch * 1000))


def _epoch(moment: Optional[datetime]) -> Optional[float]:
    return None if moment is None else (moment - _EPOCH).total_seconds()


def _rows(cluster: PressureCluster, first_id: int) -> list[Row]:
    conn = connect(cluster.port)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, status, attempt, add_time, effect_time, finish_time FROM tidemq_message "
                        "WHERE topic = %s AND id >= %s", (TOPIC, first_id))
            return [Row(i, status, attempt, _epoch(added), _epoch(effect), _epoch(finish))
                    for i, status, attempt, added, effect, finish in cur.fetchall()]
    finally:
        conn.close()
