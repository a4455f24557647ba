"""``python -m benchmarks [SCENARIO ...] [--json] [--smoke] [sizes]``: run the suite, print the table, write JSON.

Scenarios: produce, consume (with scale), delay, peers, durable, concurrency, security, flow, enqueue, aio,
results, workflow, pressure. With none named, all of them run but pressure (about 40 minutes: name
it; ``--smoke`` runs it too).
The table goes to stderr as figures arrive; the JSON document goes to ``--out`` (default
benchmarks/results/latest.json) and, with ``--json``, to stdout as one line.
``--smoke`` runs the scenarios at tiny sizes (flags given beside it still win): a check that
every scenario runs, for ``make test``; its figures mean nothing and no target is judged.
SIGTERM and SIGINT stop every server and process the run started before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback

from .report import Report

SCENARIOS = ("produce", "consume", "delay", "peers", "durable", "concurrency", "security", "flow", "enqueue", "aio",
             "results", "workflow", "pressure")
#: Scenarios that run only when named (or in --smoke): they take far longer than the others.
ON_REQUEST = ("pressure",)

#: ``--smoke``: sizes that run every scenario in a few minutes; each still takes every code path
#: (interleaved rounds aside), so a scenario that breaks fails the smoke run.
SMOKE = {
    "rounds": 1, "security_messages": 2_000, "produce_messages": 4_000, "latency_samples": 100,
    "consume_messages": 4_000, "consume_workers": [2], "consume_defaults_messages": 1_000, "pending": 5_000,
    "due": 200, "due_window": 2.0,
    "peer_messages": 500, "peer_seconds": 5.0, "peer_due": 100, "peer_window": 2.0, "peer_pending": 500,
    "celery_pools": ["solo"], "rq_workers": ["simple"], "durable_seconds": 1.0,
    "concurrency_threads": [1, 4], "concurrency_seconds": 0.5, "concurrency_warmup": 0.1,
    "flow_messages": 2_000, "flow_locks": 20, "enqueue_samples": 20, "enqueue_idle_seconds": 0.5,
    "aio_callers": [1, 16], "aio_seconds": 0.5, "aio_warmup": 0.1,
    "results_samples": 20, "results_messages": 1_000, "results_waiters": 100, "results_idle_seconds": 1.0,
    "results_warmup": 0.5, "results_cancels": 3,
    "workflow_group": 50, "workflow_rounds": 1, "workflow_samples": 20, "workflow_dag": 30,
    # One pressure end to end (a broker killed and restarted); tests/bench/test_pressures.py
    # starts and stops every other kind against real servers.
    "pressures": ["broker-kill"], "capacity_seconds": 2.0, "warmup_seconds": 1.0, "clean_seconds": 2.0,
    "stress_seconds": 3.0, "recovery_seconds": 2.0, "overload_recovery_seconds": 2.0, "kill_every": 2.0,
    "outage_seconds": 2.0,
    "idle_long_seconds": 4.0, "drain_seconds": 30.0, "preload": 2_000,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes: check that every scenario runs (targets are not judged); flags given still win")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved slices of each baseline and tidemq measurement (evens out load drift)")
    p.add_argument("--profile", metavar="DIR", default="", help="py-spy the brokers and workers into DIR")
    p.add_argument("--out", default="", help="where to write the JSON document (default "
                   "benchmarks/results/latest.json; with --smoke bench-results/smoke.json, so a smoke run never "
                   "replaces the results of a full one)")
    p.add_argument("--mariadb-option", dest="mariadb_options", action="append", default=[], metavar="OPTION",
                   help="extra mariadbd option, repeatable (e.g. --mariadb-option=--innodb-autoinc-lock-mode=2)")
    p.add_argument("--galera", action="store_true",
                   help="run on a 3-node MariaDB Galera cluster (brokers and the raw baseline write through node 1)")
    g = p.add_argument_group("security")
    g.add_argument("--security-messages", type=int, default=40_000,
                   help="messages produced, then consumed, through each of the plaintext and TLS + token brokers")
    g.add_argument("--security-workers", type=int, default=2)
    g = p.add_argument_group("produce")
    g.add_argument("--produce-messages", type=int, default=200_000)
    g.add_argument("--produce-threads", type=int, default=4)
    g.add_argument("--produce-batch", type=int, default=100, help="messages per produce_many and per raw INSERT")
    g.add_argument("--latency-samples", type=int, default=2000, help="single produce() calls timed")
    g.add_argument("--idle-gap-ms", type=float, default=5.0,
                   help="idle time before each call of the after-idle latency (a quarter of the samples)")
    g.add_argument("--produce-target", type=float, default=0.8, help="required broker/raw ratio")
    g = p.add_argument_group("consume")
    g.add_argument("--consume-messages", type=int, default=200_000)
    g.add_argument("--consume-workers", type=int, nargs="+", default=[2, 4], help="worker process counts")
    g.add_argument("--worker-threads", type=int, default=4, help="handler threads per worker")
    g.add_argument("--worker-batch", type=int, default=500, help="messages per pull")
    g.add_argument("--consume-target", type=float, default=0.6, help="required workers/raw ratio")
    g.add_argument("--e2e-target", type=float, default=5000, help="required msg/s with 2 workers (0: none)")
    g.add_argument("--no-scale", dest="scale", action="store_false", help="skip 2 brokers vs 1")
    g.add_argument("--consume-defaults-messages", type=int, default=50_000,
                   help="messages drained by workers whose consumer has every option at its default (0: skip)")
    g = p.add_argument_group("delay")
    g.add_argument("--pending", type=int, default=1_000_000, help="messages pending over the next hours")
    g.add_argument("--due", type=int, default=5_000, help="messages due within --due-window")
    g.add_argument("--due-window", type=float, default=10.0, help="seconds over which --due become due")
    g.add_argument("--delay-workers", type=int, default=2)
    g = p.add_argument_group("peers (Celery and RQ on Redis)")
    g.add_argument("--peers", nargs="+", choices=["celery", "rq"], default=["celery", "rq"])
    g.add_argument("--peer-messages", type=int, default=20_000, help="jobs produced and consumed by each peer")
    g.add_argument("--peer-seconds", type=float, default=30.0,
                   help="at most this long per consume measurement (rate = jobs run / time)")
    g.add_argument("--peer-due", type=int, default=5000, help="delayed jobs due within --peer-window")
    g.add_argument("--peer-window", type=float, default=10.0)
    g.add_argument("--peer-pending", type=int, default=20_000, help="delayed jobs pending over the next hours")
    g.add_argument("--peer-workers", type=int, default=2, help="worker processes of each peer")
    g.add_argument("--celery-pools", nargs="+", choices=["prefork", "solo", "threads"], default=["prefork", "solo"],
                   help="Celery worker pools measured; the first is the one the targets use")
    g.add_argument("--celery-concurrency", type=int, default=0,
                   help="child processes per prefork worker (0: Celery's default, one per core)")
    g.add_argument("--rq-workers", nargs="+", choices=["fork", "simple"], default=["fork", "simple"],
                   help="RQ worker classes measured: fork (rq.Worker, its default), simple (SimpleWorker)")
    g.add_argument("--peer-target", type=float, default=10.0, help="required tidemq/Celery throughput ratio")
    g = p.add_argument_group("durable peers (PGQueuer and procrastinate on PostgreSQL; also in concurrency)")
    g.add_argument("--durable-peers", nargs="*", choices=["pgqueuer", "procrastinate"],
                   default=["pgqueuer", "procrastinate"], help="PostgreSQL peers measured (none: skip them)")
    g.add_argument("--durable-seconds", type=float, default=30.0,
                   help="at most this long per peer consume measurement (rate = jobs run / their stored span)")
    g.add_argument("--pgqueuer-batch", type=int, default=100, help="PGQueuer's tuned workers: --batch-size")
    g.add_argument("--procrastinate-concurrency", type=int, default=8,
                   help="procrastinate's tuned workers: --concurrency")
    g.add_argument("--durable-produce-target", type=float, default=1.0,
                   help="required tidemq produce_many / PGQueuer batch enqueue ratio")
    g.add_argument("--durable-consume-pgqueuer-target", type=float, default=1.5,
                   help="required tidemq / PGQueuer (default workers) consume ratio, tidemq tuned and at defaults")
    g.add_argument("--durable-consume-procrastinate-target", type=float, default=5.0,
                   help="required tidemq / procrastinate (default workers) consume ratio, tidemq tuned and at defaults")
    g = p.add_argument_group("results (handles, stored results, waiting callers)")
    g.add_argument("--results-samples", type=int, default=500, help="produce -> result round trips timed")
    g.add_argument("--results-messages", type=int, default=50_000,
                   help="messages drained per round with results stored and without")
    g.add_argument("--results-waiters", type=int, default=1000, help="concurrent Results long-polls on one broker")
    g.add_argument("--results-idle-seconds", type=float, default=10.0,
                   help="seconds the waiters' broker CPU is measured")
    g.add_argument("--results-warmup", type=float, default=2.0, help="seconds for every waiter to be waiting first")
    g.add_argument("--results-cancels", type=int, default=100,
                   help="running handlers cancelled one after another, each timed to its end seen by a waiter")
    g = p.add_argument_group("workflow (chord fan-in, dependency latency, a DAG; no-op steps)")
    g.add_argument("--workflow-group", type=int, default=10_000, help="members of the group with a chord callback")
    g.add_argument("--workflow-rounds", type=int, default=6,
                   help="interleaved rounds of the chord and the plain group (a round takes about 3 s: "
                        "two rounds left the ratio's noise as wide as its margin)")
    g.add_argument("--workflow-samples", type=int, default=500, help="2-step chains timed, one at a time")
    g.add_argument("--workflow-dag", type=int, default=1000, help="nodes of the random DAG")
    g.add_argument("--workflow-seed", type=int, default=30, help="seed of the random DAG")
    g.add_argument("--workflow-workers", type=int, default=2)
    g.add_argument("--workflow-target", type=float, default=1.2,
                   help="largest chord callback start / plain consume time ratio")
    g.add_argument("--workflow-latency-target", type=float, default=5.0,
                   help="largest p50 ms from a dependency's SUCCESS to the dependent's handler start")
    g = p.add_argument_group("concurrency (one message per call from many threads; peers per --peers, --durable-peers)")
    g.add_argument("--concurrency-threads", type=int, nargs="+", default=[1, 4, 16, 64],
                   help="thread counts of the one producing process")
    g.add_argument("--concurrency-seconds", type=float, default=5.0,
                   help="timed seconds per system and thread count, split over --rounds")
    g.add_argument("--concurrency-warmup", type=float, default=0.5,
                   help="untimed seconds of calls before each timed slice")
    g.add_argument("--concurrency-peer-target", type=float, default=5.0,
                   help="required tidemq/Celery and tidemq/RQ ratio at 64 threads")
    g.add_argument("--concurrency-raw-target", type=float, default=0.5,
                   help="required tidemq/raw group commit ratio at 64 threads")
    g.add_argument("--concurrency-low-target", type=float, default=1.0,
                   help="required tidemq/Celery ratio at 4 threads")
    g.add_argument("--concurrency-single-target", type=float, default=2.0,
                   help="largest tidemq produce() p50 / raw 1-row commit p50 ratio, one thread")
    g.add_argument("--concurrency-direct-low-target", type=float, default=1.5,
                   help="required direct-path tidemq/Celery ratio at 4 threads")
    g.add_argument("--concurrency-direct-raw-target", type=float, default=0.8,
                   help="required direct-path tidemq/raw group commit ratio at 64 threads")
    g.add_argument("--concurrency-direct-single-target", type=float, default=1.3,
                   help="largest direct-path produce() p50 / raw 1-row commit p50 ratio, one thread")
    g.add_argument("--concurrency-pgqueuer-target", type=float, default=1.2,
                   help="required direct-path tidemq/PGQueuer ratio at 4 threads")
    g = p.add_argument_group("flow (lock cost with flow limits and priorities)")
    g.add_argument("--flow-messages", type=int, default=50_000, help="due messages of each of the three topics")
    g.add_argument("--flow-batch", type=int, default=100, help="messages per lock")
    g.add_argument("--flow-locks", type=int, default=200, help="locks of each topic, interleaved")
    g.add_argument("--flow-target", type=float, default=1.2, help="required limited/plain lock cost ratio")
    g = p.add_argument_group("enqueue (delivery after an application's COMMIT, beside produce)")
    g.add_argument("--enqueue-samples", type=int, default=300, help="messages enqueued, and as many produced")
    g.add_argument("--enqueue-idle-seconds", type=float, default=5.0,
                   help="seconds the broker's CPU is measured with a pull waiting and nothing produced")
    g = p.add_argument_group("aio (one message per call: sync client threads vs tidemq.aio coroutines)")
    g.add_argument("--aio-callers", type=int, nargs="+", default=[1, 16, 64],
                   help="threads of the sync client, and coroutines of the async one")
    g.add_argument("--aio-seconds", type=float, default=6.0, help="timed seconds per client and caller count")
    g.add_argument("--aio-warmup", type=float, default=0.5, help="untimed seconds before each timed slice")
    _pressure_flags(p)
    return p


def _pressure_flags(p: argparse.ArgumentParser) -> None:
    from .pressure import DEFAULT_PRESSURES, KINDS

    g = p.add_argument_group("pressure (a steady offered load through warmup, clean, stress and recovery phases, "
                             "each kind on fresh servers; docs/RELIABILITY.md)")
    g.add_argument("--pressures", nargs="+", choices=list(KINDS), default=DEFAULT_PRESSURES, metavar="KIND",
                   help=f"any of {', '.join(KINDS)} (default: all but idle-view-10m)")
    g.add_argument("--capacity", type=float, default=0.0,
                   help="msg/s to take as the capacity instead of measuring it (0: measure on the first cluster)")
    g.add_argument("--capacity-seconds", type=float, default=10.0, help="full-speed produce while workers consume")
    g.add_argument("--offered", type=float, default=0.0, help="offered msg/s (0: --offered-fraction x capacity)")
    g.add_argument("--offered-fraction", type=float, default=0.5)
    g.add_argument("--warmup-seconds", type=float, default=10.0)
    g.add_argument("--clean-seconds", type=float, default=60.0)
    g.add_argument("--stress-seconds", type=float, default=60.0)
    g.add_argument("--recovery-seconds", type=float, default=60.0)
    g.add_argument("--overload-recovery-seconds", type=float, default=150.0,
                   help="the overload's recovery phase: long enough to see its backlog drain (see docs/RELIABILITY.md)")
    g.add_argument("--idle-long-seconds", type=float, default=600.0, help="stress phase of idle-view-10m")
    g.add_argument("--outage-seconds", type=float, default=30.0,
                   help="how long MariaDB or ZooKeeper stays stopped (ZooKeeper: more than the 10 s session timeout)")
    g.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills of a worker or broker")
    g.add_argument("--kills-per-second", type=float, default=10.0, help="KILL CONNECTION of tidemq's connections")
    g.add_argument("--readers", type=int, default=4, help="REPEATABLE READ readers scanning the message table")
    g.add_argument("--overload", type=float, default=1.5, help="offered rate in the overload's stress, x capacity")
    g.add_argument("--pressure-brokers", type=int, default=2)
    g.add_argument("--pressure-workers", type=int, default=2)
    g.add_argument("--pressure-threads", type=int, default=8, help="handler threads per worker")
    g.add_argument("--pressure-worker-batch", type=int, default=0, help="messages per pull (0: tidemq's default)")
    g.add_argument("--pressure-ttr", type=float, default=10.0, help="the consumer's ttr, seconds")
    g.add_argument("--handler-ms", type=float, default=1.0, help="how long each handler call sleeps")
    g.add_argument("--pressure-batch", type=int, default=10, help="messages per produce_many call")
    g.add_argument("--pressure-senders", type=int, default=8,
                   help="threads sending the scheduled calls, each with its own Client")
    g.add_argument("--delayed-rate", type=float, default=4.0, help="delayed messages a second, due 1-3 s later")
    g.add_argument("--preload", type=int, default=0,
                   help="rows of another topic, due in 30+ days, loaded before each run (a production-sized table)")
    g.add_argument("--pressure-max-connections", type=int, default=151,
                   help="MariaDB's max_connections in these runs (151 is MariaDB's own default)")
    g.add_argument("--deadline-seconds", type=float, default=12.0,
                   help="a produce call longer than this counts as a hang (the client's deadline is 10 s)")
    g.add_argument("--drain-seconds", type=float, default=120.0, help="wait after the run for every message to finish")
    g.add_argument("--recovered-fraction", type=float, default=0.9,
                   help="recovered: a 1 s window completes at least this share of the clean rate")


def _stop_on_signals() -> None:
    """SIGTERM (like Ctrl-C's SIGINT) unwinds the run through every ``finally``, which stops
    what each scenario started; further signals are ignored so the cleanup itself completes."""

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r}: expected any of {', '.join(SCENARIOS)}")
    chosen = args.scenarios or [s for s in SCENARIOS if args.smoke or s not in ON_REQUEST]
    report = Report()
    from tests.servers import free_port
    from .env import Cluster, machine, stop_descendants

    _stop_on_signals()
    errors: dict[str, str] = {}
    cluster = None
    finished = False
    try:
        report.progress("starting MariaDB and ZooKeeper")
        cluster = Cluster(mariadb_options=tuple(args.mariadb_options), galera=args.galera)
        # Its metrics endpoint tells what the broker itself spent on a call (concurrency).
        cluster.start_broker({"TIDEMQ_METRICS_PORT": str(free_port())})
        for name in chosen:
            began, load = time.monotonic(), os.getloadavg()
            try:
                module = __import__(f"benchmarks.{name}", fromlist=["run"])
                module.run(cluster, report, args)
            except Exception as exc:  # one broken scenario must not hide the others' figures
                errors[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                report.progress("")
                print(f"\n{name} failed:\n{traceback.format_exc()}", file=sys.stderr)
            report.record(name, "scenario seconds", round(time.monotonic() - began, 1), "s")
            # Other jobs on a shared machine move absolute figures; the load says how much.
            report.record(name, "load average at start / end", f"{load[0]:.1f} / {os.getloadavg()[0]:.1f}", "",
                          f"{os.cpu_count()} cores")
        finished = True
    finally:
        report.progress("stopping servers")
        try:
            if cluster is not None:
                # The brokers' and workers' logs say why a scenario failed; a run without a
                # failure leaves nothing behind.
                kept = bool(errors) or not finished
                cluster.cleanup(keep_logs=kept)
                if kept:
                    print(f"the logs of this run's brokers and workers are in {cluster.dir}", file=sys.stderr)
        finally:
            stop_descendants()  # whatever a scenario's own cleanup left behind
            report.progress("")
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "out")}
    settings["scenarios"] = chosen
    doc = report.document(machine(), settings, errors)
    text = Report.dumps(doc)
    args.out = args.out or ("bench-results/smoke.json" if args.smoke else "benchmarks/results/latest.json")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write(text + "\n")
    if args.json:  # one line on stdout, for scripts; the file keeps the readable layout
        print(json.dumps(doc, separators=(",", ":"), default=str))
    missed = [c for c in report.checks if not c["met"]]
    judged = ("smoke run: targets not judged" if args.smoke
              else f"{len(report.checks) - len(missed)}/{len(report.checks)} targets met")
    print(f"\n{judged}; {len(errors)} scenario(s) failed; JSON in {args.out}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
