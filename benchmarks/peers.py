"""peers: the same produce, consume and delay workloads on Celery with Redis (appendonly on,
``acks_late``), started here, and tidemq's figures from this run divided by Celery's.

Celery publishes one task per call, so its produce is also compared with tidemq's single
``produce()`` from the same number of threads. Its consume is timed from the first task taken
to the queue being empty with nothing unacknowledged, so worker start-up is not counted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from argparse import Namespace
from typing import Callable, Optional

from .env import Cluster, Proc, rss_mb, wait_until
from .report import Report, summarize

__all__ = ["run", "Redis"]

QUEUE = "bench"


class Redis:
    """redis-server from Debian on a free port, append-only file on (fsync every second)."""

    def __init__(self) -> None:
        from tests.servers import free_port

        self.dir = tempfile.mkdtemp(prefix="tidemq-bench-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--save", "", "--daemonize", "no", "--protected-mode", "no"],
            stdout=open(os.path.join(self.dir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        wait_until(self._ready, 30, 0.05, f"redis-server on port {self.port}")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir}/redis.log")
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cleanup(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _threads(total: int, threads: int, send: Callable[[int], None], progress: Callable[[int], None]) -> float:
    """Run ``send(i)`` for i < total from ``threads`` threads; return calls per second."""
    done = [0] * threads
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for i in range(k, total, threads):
                send(i)
                done[k] += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        while w.is_alive():
            progress(sum(done))
            w.join(0.25)
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return total / elapsed


def _celery_workers(redis: Redis, cluster: Cluster, count: int, pool: str) -> list[Proc]:
    procs = []
    for i in range(count):
        # Solo (default): each worker is one process running one task at a time, like a tidemq
        # worker process; prefork (Celery's default) adds a child process and a pipe hop per task.
        procs.append(Proc(f"celery-{i}", [sys.executable, "-m", "celery", "-A", "benchmarks.celery_tasks", "worker",
                                          "--pool", pool, "--concurrency", "1", "-Q", QUEUE, "-n", f"bench{i}@%h", "-l", "INFO",
                                          "--without-gossip", "--without-mingle", "--without-heartbeat"],
                          {"BENCH_REDIS_URL": redis.url}, cluster.dir))

    def ready() -> bool:
        for proc in procs:
            proc.check_alive()
        return all(" ready." in open(p.log_path, errors="replace").read() for p in procs)

    wait_until(ready, 90, 0.1, f"{count} Celery workers")
    return procs


def _stop(procs: list[Proc]) -> None:
    for proc in procs:
        proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.stop(15)


def _drained(r) -> bool:
    return r.llen(QUEUE) == 0 and r.hlen("unacked") == 0


def _consume(redis: Redis, cluster: Cluster, report: Report, n: int, workers: int, pool: str) -> float:
    from . import celery_tasks

    r = redis.client
    r.flushall()
    _threads(n, 4, lambda i: celery_tasks.noop.apply_async((i,)), lambda k: report.progress(f"Celery: queueing {k:,}/{n:,}"))
    procs = _celery_workers(redis, cluster, workers, pool)
    try:
        wait_until(lambda: r.llen(QUEUE) < n, 60, 0.005, "the first Celery task to be taken")
        began = time.perf_counter()
        deadline = time.monotonic() + max(300.0, n / 50)
        while not _drained(r):
            report.progress(f"Celery: {workers} workers, {n - r.llen(QUEUE):,}/{n:,} taken")
            if time.monotonic() > deadline:
                raise TimeoutError("Celery workers did not drain the queue in time")
            time.sleep(0.02)
        return n / (time.perf_counter() - began)
    finally:
        _stop(procs)


def _delay(redis: Redis, cluster: Cluster, report: Report, args: Namespace) -> tuple[list[float], float, float]:
    """(lateness ms, worker RSS with none pending, with --celery-pending pending)."""
    from . import celery_tasks

    r = redis.client
    r.flushall()
    procs = _celery_workers(redis, cluster, args.celery_workers, args.celery_pool)
    try:
        count, window = args.celery_due, args.celery_window
        first = time.time() + 3.0 + count / 300  # Celery publishes a few hundred per second

        def send(i: int) -> None:
            eta = first + window * i / count
            celery_tasks.late.apply_async((eta,), eta=_utc(eta))

        _threads(count, 4, send, lambda k: report.progress(f"Celery: publishing {k:,}/{count:,} ETA tasks"))
        deadline = time.monotonic() + (first - time.time()) + window + 120
        while r.llen("bench:lateness") < count:
            report.progress(f"Celery: {r.llen('bench:lateness'):,}/{count:,} ETA tasks run")
            if time.monotonic() > deadline:
                raise TimeoutError("Celery ran too few ETA tasks in time")
            time.sleep(0.25)
        lateness = [float(v) for v in r.lrange("bench:lateness", 0, -1)]
        rss_none = sum(rss_mb(p.pid) for p in procs)
        pending = args.celery_pending
        later = time.time() + 3600
        _threads(pending, 4, lambda i: celery_tasks.late.apply_async((later + i,), eta=_utc(later + i)),
                 lambda k: report.progress(f"Celery: publishing {k:,}/{pending:,} tasks due in hours"))
        # Celery workers take ETA tasks off the queue at once and hold them in memory.
        wait_until(lambda: r.llen(QUEUE) == 0, 300, 0.2, "Celery workers to take the pending tasks")
        time.sleep(1.0)  # let them finish parsing what they took
        rss_pending = sum(rss_mb(p.pid) for p in procs)
        return lateness, rss_none, rss_pending
    finally:
        _stop(procs)


def _utc(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _tidemq_single_produce(cluster: Cluster, report: Report, n: int) -> float:
    client = cluster.client()
    try:
        client.produce("bench.peer", {"warm": 0})
        return _threads(n, 4, lambda i: client.produce("bench.peer", {"i": i}),
                        lambda k: report.progress(f"tidemq: single produce() {k:,}/{n:,}"))
    finally:
        client.close()


def _figure(report: Report, scenario: str, name: str) -> Optional[float]:
    value = report.figures.get(scenario, {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def run(cluster: Cluster, report: Report, args: Namespace) -> None:
    import celery

    redis = Redis()
    os.environ["BENCH_REDIS_URL"] = redis.url  # read when celery_tasks is first imported
    from . import celery_tasks

    celery_tasks.app.conf.broker_url = redis.url
    report.record("peers", "versions", f"celery {celery.__version__}, redis-server "
                  f"{subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2][2:]}")
    n = args.celery_messages
    try:
        redis.client.flushall()
        produce = _threads(n, 4, lambda i: celery_tasks.noop.apply_async((i,)),
                           lambda k: report.progress(f"Celery: publishing {k:,}/{n:,}"))
        report.record("peers", "Celery produce (4 threads)", produce, "msg/s", f"{n} tasks, one per call")
        single = _tidemq_single_produce(cluster, report, min(n, 5000))
        report.record("peers", "tidemq produce() (4 threads)", single, "msg/s", "one message per call, durable")
        report.record("peers", "ratio tidemq produce() / Celery", round(single / produce, 2), "x")
        batch = _figure(report, "produce", "produce_many through 1 broker")
        if batch is not None:
            ratio = round(batch / produce, 2)
            report.record("peers", "ratio tidemq produce_many / Celery", ratio, "x", "the produce workload")
            report.target("peers", "produce ratio", ratio, ">=", args.peer_target)
        consume = _consume(redis, cluster, report, n, args.celery_workers, args.celery_pool)
        report.record("peers", f"Celery consume ({args.celery_workers} workers)", consume, "msg/s", f"{args.celery_pool} pool, acks_late")
        ours = _figure(report, "consume", f"{args.celery_workers} worker processes, 1 broker")
        if ours is not None:
            ratio = round(ours / consume, 2)
            report.record("peers", "ratio tidemq consume / Celery", ratio, "x")
            report.target("peers", "consume ratio", ratio, ">=", args.peer_target)
        lateness, rss_none, rss_pending = _delay(redis, cluster, report, args)
        report.record("peers", f"Celery lateness: {args.celery_due} due over {args.celery_window:.0f}s",
                      summarize(lateness), "ms")
        report.record("peers", "Celery early deliveries", sum(1 for v in lateness if v < 0), "")
        report.record("peers", f"Celery workers RSS none / {args.celery_pending} pending",
                      f"{rss_none:.1f} / {rss_pending:.1f}", "MiB", f"ratio {rss_pending / rss_none:.2f}")
    finally:
        redis.cleanup()
