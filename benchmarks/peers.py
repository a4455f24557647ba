"""peers: the same produce, consume and delay workloads on Celery and RQ, both on Redis
(appendonly on) started here, and tidemq's figures from this run divided by theirs.

Each peer runs in every configuration named by its flags (Celery's worker pools, RQ's worker
classes); the first is its default and the one the targets are checked against, the others are
reported beside it. The peers publish one task per call, so their produce is also compared with
tidemq's single ``produce()`` from the same number of threads.
"""

from __future__ import annotations

import os
from argparse import Namespace
from typing import Optional

from .celery_peer import CeleryPeer
from .env import Cluster, run_threads
from .redis_peer import RedisPeer
from .redis_server import Redis
from .report import Report, summarize
from .rq_peer import RQPeer

__all__ = ["run"]


def _figure(report: Report, scenario: str, name: str) -> Optional[float]:
    value = report.figures.get(scenario, {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _tidemq_single_produce(cluster: Cluster, report: Report, n: int) -> float:
    client = cluster.client()
    try:
        client.produce("bench.peer", {"warm": 0})
        return run_threads(n, 4, lambda i: client.produce("bench.peer", {"i": i}),
                           lambda k: report.progress(f"tidemq: single produce() {k:,}/{n:,}"))
    finally:
        client.close()


def _peer(peer: RedisPeer, report: Report, args: Namespace, single: float, targets: bool) -> None:
    """Every workload on one peer; ``targets``: check the ratios against ``--peer-target``."""
    n, name = args.peer_messages, peer.name
    report.record("peers", f"{name} version", peer.version)
    produce = report.record("peers", f"{name} produce (4 threads)", peer.produce(n, 4), "msg/s",
                            f"{n} jobs, one per call")
    report.record("peers", f"ratio tidemq produce() / {name}", round(single / produce, 2), "x",
                  "both one message per call")
    batch = _figure(report, "produce", "produce_many through 1 broker")
    if batch is not None:
        ratio = round(batch / produce, 2)
        report.record("peers", f"ratio tidemq produce_many / {name}", ratio, "x", "the produce workload")
        if targets:
            report.target("peers", f"produce ratio vs {name}", ratio, ">=", args.peer_target)
    batched = peer.produce_batched(n, 4, args.produce_batch)
    if batched is not None:
        report.record("peers", f"{name} produce, batches of {args.produce_batch} (4 threads)", batched, "msg/s")
        if batch is not None:
            report.record("peers", f"ratio tidemq produce_many / {name} batches", round(batch / batched, 2), "x")
    ours = _figure(report, "consume", f"{args.peer_workers} worker processes, 1 broker")
    for k, variant in enumerate(peer.variants):
        rate = peer.consume(n, args.peer_workers, variant, args.peer_seconds)
        report.record("peers", f"{name} consume ({args.peer_workers} workers, {variant})", rate, "msg/s",
                      peer.describe(variant))
        if ours is not None:
            ratio = round(ours / rate, 2)
            default = " (its default)" if k == 0 else ""
            report.record("peers", f"ratio tidemq consume / {name} {variant}", ratio, "x", f"{variant}{default}")
            if targets and k == 0:
                report.target("peers", f"consume ratio vs {name} {variant}", ratio, ">=", args.peer_target)
    lateness, rss_none, rss_pending = peer.delay(args.peer_due, args.peer_window, args.peer_pending, args.peer_workers)
    report.record("peers", f"{name} lateness: {args.peer_due} due over {args.peer_window:.0f}s",
                  summarize(lateness), "ms", peer.describe(peer.variants[0]))
    report.record("peers", f"{name} early deliveries", sum(1 for v in lateness if v < 0), "")
    ours_late = report.figures.get("delay", {}).get(
        f"tidemq lateness: {args.peer_due} due over {args.peer_window:.0f}s, none pending")
    if targets and isinstance(ours_late, dict) and lateness:
        theirs = summarize(lateness)
        for q in ("p50", "p99"):  # the same load in the same run; below 1 means tidemq is closer to time
            report.target("peers", f"tidemq / {name} lateness {q}", round(ours_late[q] / max(theirs[q], 0.001), 3),
                          "<=", 1.0)
    report.record("peers", f"{name} workers RSS none / {args.peer_pending} pending",
                  f"{rss_none:.1f} / {rss_pending:.1f}", "MiB", f"ratio {rss_pending / rss_none:.2f}")


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    redis = Redis()
    os.environ["BENCH_REDIS_URL"] = redis.url  # read when the peers' task modules are first imported
    try:
        report.record("peers", "redis-server version", redis.version, "", "appendonly yes (fsync every second)")
        single = report.record("peers", "tidemq produce() (4 threads)",
                               _tidemq_single_produce(cluster, report, min(args.peer_messages, 5000)),
                               "msg/s", "one message per call, durable")
        for name in args.peers:
            if name == "celery":
                peer: RedisPeer = CeleryPeer(redis, cluster, args.celery_pools, args.celery_concurrency,
                                             report.progress)
            else:
                peer = RQPeer(redis, cluster, args.rq_workers, report.progress)
            # The targets are set against Celery; RQ is reported beside it.
            _peer(peer, report, args, single, targets=name == "celery")
    finally:
        redis.cleanup()
