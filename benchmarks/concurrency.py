"""concurrency: one message per call from 1, 4, 16 and 64 threads of one process.

Systems, each called by the same threads with the same payload (``raw.payload``):

- tidemq ``produce()`` through one broker, one ``Client`` shared by the threads;
- tidemq ``produce()`` on the direct path (``TIDEMQ_PRODUCE=direct``): the producing process
  commits into MariaDB itself, one ``Client`` shared by the threads;
- Celery ``apply_async`` and RQ ``enqueue`` on Redis (appendonly on), publishing only: the queue
  is flushed after every slice, no worker runs;
- PGQueuer ``SyncQueries.enqueue`` (a psycopg connection per thread) and procrastinate
  ``Task.defer`` (one app, its connector's pool) on PostgreSQL as shipped (fsync and
  synchronous_commit on), publishing only: their tables are truncated after every slice;
- the raw floors on the same MariaDB: a PyMySQL 1-row INSERT + COMMIT per call on one connection
  per thread, and a group-committed one (``raw.GroupCommitter``: the threads hand their rows to
  one writer thread that commits whatever is queued in one multi-row INSERT, then wakes them).

Every slice starts its threads, lets them run ``--concurrency-warmup`` seconds untimed, then
counts the calls that end inside the next window; latency is per call over the same calls. The
``Client`` is shared by the threads; Celery keeps its default connection pool (10).
Systems alternate in ``--rounds`` slices (order reversed every other round), as in the other
scenarios. Around each slice through the broker its own counters are read (``broker_metrics``):
the rows of each group commit, and what each Produce took in the broker from its arrival to its
commit. With the client's Produce calls (its coalescer's flushes: how many ``produce()`` calls
each carried), they tell how much of a call the broker spends; the rest is the hops and the
client's own work around it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from argparse import Namespace
from typing import Callable, Optional

from . import broker_metrics, raw
from .durable import make_peers
from .env import Cluster, cpu_seconds
from .pg_peer import PgPeer
from .postgres_server import PostgreSQL
from .profile import profiled
from .report import Report, summarize

__all__ = ["run"]

TOPIC = "bench.concurrency"
RAW_TOPIC = "bench.rawconcurrency"
_BODY = json.loads(raw.payload(0))["body"]
Sender = tuple[Callable[[int], None], Callable[[], None]]  # send(i), close()


def _data(i: int) -> dict:
    return {"i": i, "body": _BODY}  # encodes to raw.payload(i)


def _counters(port: int, client) -> dict[str, float]:
    """The broker's Produce counters (none without its metrics endpoint) and the client's flushes."""
    found = broker_metrics.read(port) if port else {}
    found["flushes"], found["requests"] = client.producer.flushes, client.producer.requests
    return found


class _Slice:
    """Calls that ended inside the timed window, their latencies (ms), and CPU seconds per process."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self.latencies: list[float] = []
        self.cpu: dict[str, float] = {}

    def add(self, other: "_Slice") -> None:
        self.calls += other.calls
        self.seconds += other.seconds
        self.latencies += other.latencies
        for k, v in other.cpu.items():
            self.cpu[k] = self.cpu.get(k, 0.0) + v


Pids = dict[str, "list[int] | Callable[[], list[int]]"]  # a callable is read once the senders are connected


def _timed(threads: int, prepare: Callable[[int], Sender], warmup: float, seconds: float,
           pids: Pids, progress: Callable[[str], None]) -> _Slice:
    """``threads`` threads calling their ``send`` back to back; the window opens ``warmup`` s after
    they all start (connections made in ``prepare`` are outside it) and lasts ``seconds``. A
    process group given as a callable (a server's backends) is listed at the window's opening."""
    spans: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    window = [0.0, 0.0]
    groups: dict[str, list[int]] = {}

    def open_window() -> None:
        # Listed before any sender is let go: a server's backends exist once every thread has
        # connected, and reading /proc must not take the senders' time.
        groups.update({name: group() if callable(group) else group for name, group in pids.items()})
        now = time.perf_counter()
        window[:] = [now + warmup, now + warmup + seconds]

    barrier = threading.Barrier(threads + 1, action=open_window)

    def run(k: int) -> None:
        close: Optional[Callable[[], None]] = None
        try:
            send, close = prepare(k)
            barrier.wait()
            end, mine, clock = window[1], spans[k], time.perf_counter
            i = k
            while not errors:
                began = clock()
                if began >= end:
                    break
                send(i)
                mine.append((began, clock()))
                i += threads
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            if close is not None:
                close()

    workers = [threading.Thread(target=run, args=(k,), name=f"bench-{k}") for k in range(threads)]
    for w in workers:
        w.start()
    out = _Slice()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    else:
        cpu: dict[str, float] = {}
        for edge in (0, 1):  # CPU read at the window's edges, not over connects or warm-up
            while not errors and time.perf_counter() < window[edge]:
                progress(f"{'warming up' if edge == 0 else 'timing'}")
                time.sleep(min(0.25, max(0.0, window[edge] - time.perf_counter())))
            sample = {name: sum(cpu_seconds(p) for p in group) for name, group in groups.items()}
            cpu = {k: sample[k] - cpu.get(k, 0.0) for k in sample} if edge else sample
        out.cpu = cpu
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    w0, w1 = window
    for mine in spans:  # every call that ended inside the window (none starts after it closes)
        for began, ended in mine:
            if w0 <= ended <= w1:
                out.latencies.append((ended - began) * 1000)
    out.calls, out.seconds = len(out.latencies), w1 - w0
    return out


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    from .redis_server import Redis

    if len(cluster.brokers) != 1:
        raise RuntimeError(f"the concurrency scenario needs exactly one broker, found {len(cluster.brokers)}")
    url, counts, rounds = cluster.db_url, args.concurrency_threads, args.rounds
    per_slice = args.concurrency_seconds / rounds
    redis = Redis()
    os.environ["BENCH_REDIS_URL"] = redis.url  # read when the peers' task modules are first imported
    pg: Optional[PostgreSQL] = None
    durable: dict[str, PgPeer] = {}
    client = cluster.client()
    direct = cluster.client(direct=True)
    metrics_port = cluster.brokers[0].metrics_port
    try:
        if args.durable_peers:
            pg = PostgreSQL()
        peers: dict[str, object] = {}
        for name in args.peers:
            if name == "celery":
                from .celery_peer import CeleryPeer

                peers["Celery"] = CeleryPeer(redis, cluster, args.celery_pools, args.celery_concurrency,
                                             report.progress)
            else:
                from .rq_peer import RQPeer

                peers["RQ"] = RQPeer(redis, cluster, args.rq_workers, report.progress)
        if pg is not None:
            durable = make_peers(pg, cluster, report, args)
        versions = [f"redis {redis.version}", *(p.version for p in peers.values())]
        if pg is not None:
            versions += [f"PostgreSQL {pg.version}", *(p.version for p in durable.values())]
        report.record("concurrency", "versions", "; ".join(versions), "",
                      "Redis appendonly yes (fsync every second); PostgreSQL fsync and synchronous_commit on")
        broker, mariadb, me = cluster.brokers[0].pid, cluster.mariadb.proc.pid, os.getpid()
        client.produce(TOPIC, _data(-1))  # channel, topic row, caches
        direct.produce(TOPIC, _data(-1))  # its pool and topic cache
        systems: dict[str, tuple[str, Pids]] = {  # label, processes whose CPU is read
            "tidemq": ("tidemq produce()", {"broker": [broker], "mariadb": [mariadb], "client": [me]}),
            "tidemq direct": ("tidemq direct produce()", {"mariadb": [mariadb], "client": [me]}),
            "raw group": ("raw group commit", {"mariadb": [mariadb], "client": [me]}),
            "raw 1-row": ("raw 1-row commit", {"mariadb": [mariadb], "client": [me]}),
        }
        for name in peers:
            systems[name] = (f"{name} {'apply_async' if name == 'Celery' else 'enqueue'}",
                             {"redis": [redis.proc.pid], "client": [me]})
        for name in durable:
            systems[name] = (f"{name} {'enqueue' if name == 'PGQueuer' else 'defer'}",
                             {"postgres": pg.pids, "client": [me]})
        results = {(s, t): _Slice() for s in systems for t in counts}
        counters: dict[int, dict[str, float]] = {t: {} for t in counts}  # deltas over the tidemq slices
        group = {t: {"rows": 0, "commits": 0} for t in counts}
        for r in range(rounds):
            for threads in counts:
                raw.truncate(url)
                order = list(systems) if r % 2 == 0 else list(reversed(systems))
                for system in order:
                    def progress(text: str, s: str = system, t: int = threads) -> None:
                        report.progress(f"round {r + 1}/{rounds}: {systems[s][0]} x{t} threads: {text}")

                    writer: Optional[raw.GroupCommitter] = None
                    if system in ("tidemq", "tidemq direct"):
                        def prepare(k: int, c=client if system == "tidemq" else direct) -> Sender:
                            return (lambda i: c.produce(TOPIC, _data(i))), (lambda: None)
                    elif system == "raw group":
                        writer = raw.GroupCommitter(url, RAW_TOPIC)

                        def prepare(k: int, w: raw.GroupCommitter = writer) -> Sender:
                            return w.send, (lambda: None)
                    elif system == "raw 1-row":
                        def prepare(k: int) -> Sender:
                            c = raw.RowCommitter(url, RAW_TOPIC)
                            return c.send, c.close
                    elif system in durable:
                        prepare = durable[system].sender
                    else:
                        peer = peers[system]

                        def prepare(k: int, p=peer) -> Sender:
                            return (lambda i: p.send(i, _data(i))), (lambda: None)

                    before = _counters(metrics_port, client) if system == "tidemq" else None
                    profile = args.profile if (r == 0 and system == "tidemq" and threads == max(counts)) else ""
                    with profiled(profile, f"concurrency-x{threads}", {"broker": [broker]}):
                        got = _timed(threads, prepare, args.concurrency_warmup, per_slice, systems[system][1], progress)
                    results[(system, threads)].add(got)
                    if before is not None:
                        after = _counters(metrics_port, client)
                        for key, value in after.items():
                            counters[threads][key] = counters[threads].get(key, 0.0) + value - before[key]
                    if writer is not None:
                        writer.close()
                        group[threads]["rows"] += writer.rows
                        group[threads]["commits"] += writer.commits
                    if system in peers:
                        queued = peers[system].waiting()
                        if queued < got.calls:  # they must have reached this Redis's queue
                            raise AssertionError(f"{system}: {queued} jobs queued after {got.calls} timed calls")
                        redis.client.flushall()  # no worker: drop what was published
                    if system in durable:
                        queued = durable[system].queued()
                        if queued < got.calls:  # they must have been committed to its table
                            raise AssertionError(f"{system}: {queued} jobs stored after {got.calls} timed calls")
                        durable[system].truncate()
        _report(report, args, systems, results, counters, group, counts, list(peers) + list(durable))
    finally:
        client.close()
        direct.close()
        redis.cleanup()
        for d in durable.values():
            d.close()
        if pg is not None:
            pg.cleanup()
        raw.truncate(url)


def _report(report: Report, args: Namespace, systems: dict, results: dict, counters: dict, group: dict,
            counts: list[int], peers: list[str]) -> None:
    rate = {key: (s.calls / s.seconds if s.seconds else 0.0) for key, s in results.items()}
    splits = {t: _split(c) for t, c in counters.items()}
    for threads in counts:
        for system, (label, _) in systems.items():
            s = results[(system, threads)]
            lat = summarize(s.latencies)
            cpu = " ".join(f"{k} {v / s.seconds:.2f}" for k, v in s.cpu.items()) if s.seconds else ""
            note = f"cpu s/s: {cpu}"
            if system == "raw group" and group[threads]["commits"]:
                note += f"; {group[threads]['rows'] / group[threads]['commits']:.1f} rows/commit"
            split = splits[threads] if system == "tidemq" else None
            if split:
                note += (f"; {split['rows per commit']} rows/commit; {split['broker ms']} ms in the broker per "
                         f"Produce of {split['per Produce']}")
            report.record("concurrency", f"{label} x{threads}",
                          {"msg/s": round(rate[(system, threads)], 1), "p50": lat["p50"], "p99": lat["p99"]},
                          "msg/s, ms", note)
        for path in ("tidemq", "tidemq direct"):
            ours = rate[(path, threads)]
            ratios = {name.lower(): round(ours / rate[(name, threads)], 2) for name in peers if rate[(name, threads)]}
            for key, system in (("raw_group", "raw group"), ("raw_1row", "raw 1-row")):
                if rate[(system, threads)]:
                    ratios[key] = round(ours / rate[(system, threads)], 3)
            report.record("concurrency", f"ratio {path} / others x{threads}", ratios, "x",
                          f"{args.rounds} interleaved rounds of {args.concurrency_seconds / args.rounds:g} s")
    for key, unit, note in (
            ("rows per commit", "rows", "by threads; the broker's tidemq_group_commit_rows"),
            ("broker ms", "ms", "by threads; the broker's tidemq_produce_duration_seconds: arrival to commit"),
            ("per Produce", "messages", "by threads; the client's produce() calls per Produce it sent")):
        report.record("concurrency", f"tidemq produce(): {key}", {t: s[key] if s else None for t, s in splits.items()},
                      unit, note)
    report.record("concurrency", "raw group commit rows per commit",
                  {t: round(g["rows"] / g["commits"], 1) if g["commits"] else None for t, g in group.items()}, "rows",
                  "by threads; warm-up included")

    def ratio(threads: int, path: str, system: str) -> Optional[float]:
        if threads not in counts or (system, threads) not in rate or not rate[(system, threads)]:
            return None
        return round(rate[(path, threads)] / rate[(system, threads)], 3)

    for path, threads, system, limit in (
            ("tidemq", 64, "Celery", args.concurrency_peer_target), ("tidemq", 64, "RQ", args.concurrency_peer_target),
            ("tidemq", 64, "raw group", args.concurrency_raw_target),
            ("tidemq", 4, "Celery", args.concurrency_low_target),
            ("tidemq direct", 64, "Celery", args.concurrency_peer_target),
            ("tidemq direct", 64, "raw group", args.concurrency_direct_raw_target),
            ("tidemq direct", 4, "Celery", args.concurrency_direct_low_target),
            ("tidemq direct", 4, "PGQueuer", args.concurrency_pgqueuer_target)):
        value = ratio(threads, path, system)
        if value is not None:
            report.target("concurrency", f"x{threads} {path} / {system}", value, ">=", limit)
    # One caller: a call's p50 over the raw 1-row INSERT + COMMIT's, the floor of a durable call.
    if 1 in counts:
        floor = summarize(results[("raw 1-row", 1)].latencies)["p50"]
        for path, limit in (("tidemq", args.concurrency_single_target),
                            ("tidemq direct", args.concurrency_direct_single_target)):
            p50 = summarize(results[(path, 1)].latencies)["p50"]
            if floor and p50:
                report.target("concurrency", f"x1 {path} p50 / raw 1-row p50", round(p50 / floor, 2), "<=", limit)


def _split(deltas: dict[str, float]) -> Optional[dict[str, float]]:
    """Rows per group commit, the broker's mean ms per Produce and produce() calls per Produce,
    from the counter deltas of the tidemq slices (None without the broker's endpoint)."""
    produces = deltas.get("tidemq_produce_duration_seconds_count", 0.0)
    commits = deltas.get("tidemq_group_commit_rows_count", 0.0)
    if not produces or not commits or not deltas.get("flushes"):
        return None
    return {"rows per commit": round(deltas["tidemq_group_commit_rows_sum"] / commits, 1),
            "broker ms": round(deltas["tidemq_produce_duration_seconds_sum"] / produces * 1000, 3),
            "per Produce": round(deltas["requests"] / deltas["flushes"], 1)}
