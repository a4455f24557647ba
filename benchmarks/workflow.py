"""workflow: what waiting on other messages costs, with two workers of no-op steps.

- fan-in: a group of ``--workflow-group`` no-op steps with a chord callback, from the first
  submit call to the callback's handler start, against the same number of plain messages
  (produce_many, no dependencies) consumed by the same workers, from the first produce call to
  the last SUCCESS the broker stamped; alternating over ``--workflow-rounds``, total against total. The
  chord is one submission however wide (``tests/workflow_runs.wide_chord``: the callback waits
  on every member); the plain messages go in produce_many calls of MAX_BATCH (10,000).
- dependency latency, idle system: ``--workflow-samples`` 2-step chains one after another. The
  figure the target judges runs from the SUCCESS stamp of the first step (the time the broker
  takes in the ack's transaction, UTC truncated to the ms, so the figure may read up to 1 ms
  long; the commit and the release are inside it) to the second step's handler start (the
  worker's clock; one host). Beside it: from the first step's handler end (so the ack's trip
  from the worker is inside it too) to the second's start, and the baseline, from the
  produce() call of a message with no dependency to its handler start. Then again with a
  second broker (a fifth of the samples): a pull waiting on one broker and an ack through the
  other.
- DAG: a random DAG of ``--workflow-dag`` nodes (seed ``--workflow-seed``: several roots, fan-ins
  and fan-outs; ``tests/workflow_runs.random_dag``) submitted as one workflow, until every
  step succeeded: the steps that started before one of their dependencies ended, and the
  steps that ran more than once; 0 and 0 expected.

Every handler appends its run to one log (``benchmarks/workflow_steps.py``).
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from datetime import datetime
from pathlib import Path

from tests.workflow_runs import check_order, dag_shape, random_dag, read_runs, submit_dag, wide_chord
from tidemq import chain, sig
from tidemq.limits import MAX_BATCH

from . import raw
from .env import Cluster
from .report import Report, summarize

__all__ = ["run"]

TOPIC = "bench.workflow"
_EPOCH = datetime(1970, 1, 1)


def _epoch(moment: datetime) -> float:
    return (moment - _EPOCH).total_seconds()


def _drained(cluster: Cluster, procs: list, what: str, timeout: float) -> None:
    """Wait until no message of the topic is WAITING, NEW or RUNNING."""
    watch = raw.Watch(cluster.db_url)
    try:
        deadline = time.monotonic() + timeout
        while watch.unfinished(TOPIC):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not finished within {timeout:.0f} s")
            for proc in procs:
                proc.check_alive()
            time.sleep(0.02)
    finally:
        watch.close()


def _plain_seconds(cluster: Cluster, client, procs: list, n: int, width: int = MAX_BATCH) -> dict[str, float]:
    """{"total": first produce call -> last SUCCESS stamp, "submit": the produce_many calls}."""
    began = time.time()
    ids: list[int] = []
    for start in range(0, n, width):
        ids += client.produce_many(TOPIC, [{"n": i} for i in range(start, min(n, start + width))])
    submitted = time.time()
    _drained(cluster, procs, f"{n:,} plain messages", max(120.0, n / 100))
    stamps = raw.finish_times(cluster.db_url, ids)
    if len(stamps) != n:
        raise AssertionError(f"{len(stamps)} of {n} plain messages are SUCCESS")
    return {"total": _epoch(max(stamps.values())) - began, "submit": submitted - began}


def _chord_seconds(cluster: Cluster, client, log: Path, n: int) -> dict[str, float]:
    """{"total": submit call -> the callback's handler start, "submit": the submit call,
    "members": submit call -> the last member's SUCCESS stamp}."""
    began = time.time()
    members, callback = wide_chord(client, TOPIC, n, TOPIC)
    submitted = time.time()
    callback.result(timeout=max(120.0, n / 100))
    runs = read_runs(log)
    [ran] = runs[callback.id]
    late = [i for i in members if min((r.end for r in runs.get(i, ())), default=float("inf")) > ran.start]
    if late:  # the figure would be wrong, and the release too
        raise AssertionError(f"the callback started before {len(late)} steps it waits on ended, e.g. {late[:5]}")
    last = max(raw.finish_times(cluster.db_url, members).values())
    return {"total": ran.start - began, "submit": submitted - began, "members": _epoch(last) - began}


def _fan_in(cluster: Cluster, report: Report, args: Namespace, client, procs: list, log: Path) -> None:
    n, rounds = args.workflow_group, args.workflow_rounds
    chord_s = {"total": 0.0, "submit": 0.0, "members": 0.0}
    plain_s = {"total": 0.0, "submit": 0.0}
    for round_ in range(rounds):
        for kind in (("chord", "plain") if round_ % 2 == 0 else ("plain", "chord")):
            report.progress(f"round {round_ + 1}/{rounds}: {kind}, {n:,} steps")
            got = (_chord_seconds(cluster, client, log, n) if kind == "chord"
                   else _plain_seconds(cluster, client, procs, n))
            for k, v in got.items():
                (chord_s if kind == "chord" else plain_s)[k] += v
    report.record("workflow", f"group of {n:,} -> chord callback start", round(chord_s["total"] / rounds, 3),
                  "s", "one submission")
    report.record("workflow", f"{n:,} plain messages consumed", round(plain_s["total"] / rounds, 3), "s",
                  "produce_many -> last SUCCESS")
    # Where the difference goes: submitting, the members' acks (each releases its dependents),
    # the hops to the callback.
    report.record("workflow", "chord: submit call / last member SUCCESS", f"{chord_s['submit'] / rounds:.3f} / "
                  f"{chord_s['members'] / rounds:.3f}", "s",
                  f"plain: produce_many calls {plain_s['submit'] / rounds:.3f}")
    ratio = round(chord_s["total"] / plain_s["total"], 3)
    report.record("workflow", "ratio chord / plain", ratio, "x", f"{rounds} interleaved rounds")
    report.target("workflow", f"group of {n} chord / plain", ratio, "<=", args.workflow_target)


def _latency(cluster: Cluster, report: Report, args: Namespace, client, log: Path, samples: int) -> None:
    brokers = f"{len(cluster.brokers)} broker" + ("s" if len(cluster.brokers) > 1 else "")
    chains: list[tuple[int, int]] = []
    plain: list[tuple[float, int]] = []
    for i in range(5 + samples):  # the first five untimed: channels, first pulls
        first, second = chain(sig(TOPIC, {"first": i}), sig(TOPIC, {"second": i})).produce(client, result=True)
        second.result(timeout=60)
        began = time.time()
        alone = client.produce(TOPIC, {"alone": i}, result=True)
        alone.result(timeout=60)
        if i >= 5:
            chains.append((first.id, second.id))
            plain.append((began, alone.id))
        if i % 20 == 0:
            report.progress(f"dependency latency, {brokers}: {i}/{samples + 5}")
    runs = read_runs(log)
    stamps = raw.finish_times(cluster.db_url, [a for a, _ in chains])
    after_success = [(runs[b][0].start - _epoch(stamps[a])) * 1000 for a, b in chains]
    after_end = [(runs[b][0].start - runs[a][0].end) * 1000 for a, b in chains]
    baseline = summarize([(runs[m][0].start - began) * 1000 for began, m in plain])
    lat = summarize(after_success)
    report.record("workflow", f"dependency SUCCESS -> dependent start, {brokers}", lat, "ms",
                  "broker's SUCCESS stamp (ms) -> handler start, idle")
    report.record("workflow", f"dependency handler end -> dependent start, {brokers}", summarize(after_end), "ms",
                  "ack trip included")
    report.record("workflow", f"no dependency: produce -> handler start, {brokers}", baseline, "ms", "baseline")
    report.record("workflow", f"dependent start p50 / p99 (baseline), {brokers}",
                  f"{lat['p50']:.2f} / {lat['p99']:.2f} ({baseline['p50']:.2f} / {baseline['p99']:.2f})", "ms")
    report.target("workflow", f"dependent start p50 ms, {brokers}", lat["p50"], "<=", args.workflow_latency_target)


def _dag(cluster: Cluster, report: Report, args: Namespace, client, procs: list, log: Path) -> None:
    deps = random_dag(args.workflow_dag, args.workflow_seed)
    began = time.time()
    ids = submit_dag(client, TOPIC, deps)
    _drained(cluster, procs, f"a DAG of {len(deps):,} nodes", max(120.0, len(deps) / 10))
    seconds = time.time() - began
    succeeded = len(raw.finish_times(cluster.db_url, ids))
    order = check_order(ids, deps, read_runs(log))
    report.record("workflow", f"DAG of {len(deps):,} nodes", dag_shape(deps), "", f"seed {args.workflow_seed}")
    report.record("workflow", "DAG submit -> every step SUCCESS", round(seconds, 3), "s",
                  f"{succeeded:,} SUCCESS, {len(order.missing)} never ran")
    report.record("workflow", "DAG steps started before a dependency ended", len(order.early), "",
                  str(order.early[:3]) if order.early else "")
    duplicates = sum(n - 1 for n in order.duplicates.values())
    report.record("workflow", "DAG duplicate runs", duplicates, "")
    wrong = len(order.early) + duplicates + len(order.missing) + (len(deps) - succeeded)
    report.target("workflow", "DAG early starts + duplicates + not done", wrong, "<=", 0)


def _start(cluster: Cluster, args: Namespace, log: Path) -> list:
    return cluster.start_workers(args.workflow_workers, TOPIC, {
        "BENCH_THREADS": str(args.worker_threads), "BENCH_BATCH": str(args.worker_batch),
        "BENCH_RECORD_FILE": str(log)}, module="benchmarks.workflow_steps")


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    raw.truncate(cluster.db_url)
    log = Path(cluster.dir) / "workflow-runs.log"
    try:
        procs = _start(cluster, args, log)
        client = cluster.client()
        try:
            _fan_in(cluster, report, args, client, procs, log)
            _latency(cluster, report, args, client, log, args.workflow_samples)
            _dag(cluster, report, args, client, procs, log)
        finally:
            client.close()
            cluster.stop_workers()
        # The same chains with a second broker: the workers' pulls and the acks that release a
        # step may go through different brokers.
        cluster.start_broker()
        try:
            _start(cluster, args, log)
            client = cluster.client()
            try:
                _latency(cluster, report, args, client, log, max(5, args.workflow_samples // 5))
            finally:
                client.close()
                cluster.stop_workers()
        finally:
            cluster.brokers.pop().stop()
    finally:
        raw.truncate(cluster.db_url)
        if os.path.exists(log):
            os.remove(log)
