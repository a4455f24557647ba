"""durable: the batch produce, consume and delay workloads on PGQueuer and procrastinate, the
durable Python queues, on a PostgreSQL started here as shipped (fsync and synchronous_commit on),
beside tidemq in the same run.

- batch produce: ``--produce-messages`` jobs in calls of ``--produce-batch`` from
  ``--produce-threads`` threads, tidemq's ``produce_many`` through one broker and each peer's
  batch call alternating in ``--rounds`` slices (order reversed every other round), each rate
  total jobs over total time, as in ``produce``.
- consume: ``--peer-workers`` worker processes drain ``--consume-messages / --rounds`` no-op jobs
  (the slice tidemq's workers drain in ``consume``), timed by the peer's own stored times, at most
  ``--durable-seconds``; each peer in its default configuration, then tuned. tidemq's figures are the
  ``consume`` scenario's: its workers as ``make bench`` sets them and with every option left at
  its default.
- delay: ``--peer-due`` jobs due over ``--peer-window`` seconds (the load of ``delay``'s first
  phase), published in calls of 10 sharing a due time from 4 threads, run by the default workers.

Targets are judged on the peers' default configurations; the tuned ones are printed beside.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Optional

from . import raw
from .env import Cluster
from .pg_peer import PgPeer
from .postgres_server import PostgreSQL
from .produce import _broker_rate
from .report import Report, summarize

__all__ = ["run", "make_peers"]

S = "durable"


def make_peers(pg: PostgreSQL, cluster: Cluster, report: Report, args: Namespace) -> dict[str, PgPeer]:
    """The peers named by ``--durable-peers``, their tables installed on ``pg``."""
    peers: dict[str, PgPeer] = {}
    for name in args.durable_peers:
        if name == "pgqueuer":
            from .pgqueuer_peer import PGQueuerPeer

            peers["PGQueuer"] = PGQueuerPeer(pg, cluster, args.pgqueuer_batch, report.progress)
        else:
            from .procrastinate_peer import ProcrastinatePeer

            peers["procrastinate"] = ProcrastinatePeer(pg, cluster, args.procrastinate_concurrency, report.progress)
    return peers


def _figure(report: Report, scenario: str, name: str) -> Optional[float]:
    value = report.figures.get(scenario, {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _produce(cluster: Cluster, report: Report, args: Namespace, peers: dict[str, PgPeer]) -> None:
    threads, batch, rounds = args.produce_threads, args.produce_batch, args.rounds
    per = args.produce_messages // rounds // (threads * batch) * threads * batch
    seconds = {name: 0.0 for name in ["tidemq", *peers]}
    for r in range(rounds):
        order = list(seconds) if r % 2 == 0 else list(reversed(seconds))
        for name in order:
            report.progress(f"round {r + 1}/{rounds}: {name} batches of {batch} from {threads} threads, {per:,} jobs")
            if name == "tidemq":
                rate, _ = _broker_rate(cluster, report, "bench.durable", per, threads, batch)
                raw.truncate(cluster.db_url)
            else:
                rate = peers[name].produce_batched(per, threads, batch)
                peers[name].truncate()
            seconds[name] += per / rate
    rates = {name: per * rounds / s for name, s in seconds.items()}
    how = f"{threads} threads x {batch} per call, {per * rounds:,} jobs"
    report.record(S, "tidemq produce_many", rates["tidemq"], "msg/s", how + ", through 1 broker")
    for name, peer in peers.items():
        call = "SyncQueries.enqueue(lists)" if name == "PGQueuer" else "Task.batch_defer"
        report.record(S, f"{name} batch produce", rates[name], "msg/s", f"{how}, {call}")
        ratio = round(rates["tidemq"] / rates[name], 3)
        report.record(S, f"ratio tidemq produce_many / {name}", ratio, "x", f"{rounds} interleaved rounds")
        if name == "PGQueuer":
            report.target(S, "produce_many / PGQueuer batch", ratio, ">=", args.durable_produce_target)


def _consume(report: Report, args: Namespace, peers: dict[str, PgPeer]) -> None:
    workers, n = args.peer_workers, args.consume_messages // args.rounds
    ours = {"as make bench sets it": _figure(report, "consume", f"{workers} worker processes, 1 broker"),
            "consumer defaults": _figure(report, "consume", f"{workers} worker processes, consumer defaults")}
    limits = {"PGQueuer": args.durable_consume_pgqueuer_target,
              "procrastinate": args.durable_consume_procrastinate_target}
    for name, peer in peers.items():
        for k, variant in enumerate(peer.variants):
            rate, done = peer.consume(n, workers, variant, args.durable_seconds)
            report.record(S, f"{name} consume ({workers} workers, {variant})", rate, "msg/s",
                          f"{peer.describe(variant)}; {done:,} of {n:,} jobs run")
            for how, value in ours.items():
                if value is None or not rate:
                    continue
                if k > 0 and how == "consumer defaults":
                    continue  # tuned against tuned only
                ratio = round(value / rate, 3)
                report.record(S, f"ratio tidemq ({how}) / {name} {variant}", ratio, "x",
                              "tidemq from the consume scenario")
                if k == 0 and name in limits:
                    report.target(S, f"consume tidemq ({how}) / {name} default", ratio, ">=", limits[name])
    if None in ours.values():
        report.record(S, "tidemq consume figures", "missing", "", "run the consume scenario with 2 workers for ratios")


def _delay(report: Report, args: Namespace, peers: dict[str, PgPeer]) -> None:
    due, window = args.peer_due, args.peer_window
    ours = report.figures.get("delay", {}).get(f"tidemq lateness: {due} due over {window:.0f}s, none pending")
    for name, peer in peers.items():
        lateness, missing = peer.delay(due, window, args.peer_workers)
        note = peer.describe(peer.variants[0])
        if missing:
            note += f"; {missing} had not run 120 s after the last was due (counted as that late: a lower bound)"
        theirs = report.record(S, f"{name} lateness: {due} due over {window:.0f}s", summarize(lateness), "ms", note)
        report.record(S, f"{name} early deliveries", sum(1 for v in lateness if v < 0), "")
        if isinstance(ours, dict) and lateness:
            # The same load in the same run; below 1 means tidemq's handlers run closer to time.
            report.target(S, f"tidemq / {name} lateness p99", round(ours["p99"] / max(theirs["p99"], 0.001), 3),
                          "<=", 1.0)


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    report.progress("starting PostgreSQL")
    pg = PostgreSQL()
    peers: dict[str, PgPeer] = {}
    try:
        peers = make_peers(pg, cluster, report, args)
        report.record(S, "versions", f"PostgreSQL {pg.version}; " + "; ".join(p.version for p in peers.values()), "",
                      "fsync on, synchronous_commit on (as shipped)")
        _produce(cluster, report, args, peers)
        _consume(report, args, peers)
        _delay(report, args, peers)
    finally:
        for peer in peers.values():
            peer.close()
        pg.cleanup()
