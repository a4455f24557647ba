"""The Celery peer: Redis broker (appendonly on), ``acks_late``, worker processes started here.

Celery publishes one task per ``apply_async`` (it has no batch publish). Its consume is timed
from the first task taken to the queue being empty with nothing unacknowledged, so worker
start-up is not counted. Its ETA tasks are taken off the queue at once and held in worker
memory until due, which is why its RSS is read with tasks pending.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

from .env import Cluster, Proc, run_threads, stop_all, tree_rss_mb, wait_until
from .redis_server import Redis

__all__ = ["CeleryPeer"]

QUEUE = "bench"


def _utc(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


class CeleryPeer:
    """Celery 5 on Redis. ``variants`` are worker pools; the first is the one the targets use."""

    name = "Celery"

    def __init__(self, redis: Redis, cluster: Cluster, pools: list[str], concurrency: int,
                 progress: Callable[[str], None]) -> None:
        import celery

        self.redis, self.cluster, self.progress = redis, cluster, progress
        self.variants = pools
        self.concurrency = concurrency
        from . import celery_tasks

        celery_tasks.app.conf.broker_url = redis.url
        self.tasks = celery_tasks
        self.version = f"celery {celery.__version__}"

    def describe(self, variant: str) -> str:
        if variant == "solo":
            return "solo pool (one task at a time per process)"
        unit = "child processes" if variant == "prefork" else "threads"
        return f"{variant} pool, {self.concurrency or 'one per core (Celery default)'} {unit} per worker"

    def _workers(self, count: int, pool: str) -> list[Proc]:
        procs = []
        for i in range(count):
            cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_tasks", "worker", "--pool", pool,
                   "-Q", QUEUE, "-n", f"bench{i}@%h", "-l", "INFO",
                   "--without-gossip", "--without-mingle", "--without-heartbeat"]
            if pool != "solo" and self.concurrency:
                cmd += ["--concurrency", str(self.concurrency)]
            procs.append(Proc(f"celery-{pool}-{i}", cmd, {"BENCH_REDIS_URL": self.redis.url}, self.cluster.dir))

        def ready() -> bool:
            for proc in procs:
                proc.check_alive()
            return all(" ready." in open(p.log_path, errors="replace").read() for p in procs)

        wait_until(ready, 90, 0.1, f"{count} Celery workers")
        return procs

    def produce(self, n: int, threads: int) -> float:
        """Tasks published per second, one ``apply_async`` per task from ``threads`` threads."""
        self.redis.client.flushall()
        return run_threads(n, threads, lambda i: self.tasks.noop.apply_async((i,)),
                           lambda k: self.progress(f"Celery: publishing {k:,}/{n:,}"))

    def produce_batched(self, n: int, threads: int, batch: int) -> None:
        """Celery has no batch publish."""
        return None

    def consume(self, n: int, workers: int, pool: str, budget: float) -> float:
        """No-op tasks run per second by ``workers`` worker processes of ``pool``, over ``n`` tasks
        or ``budget`` seconds, whichever ends first."""
        r = self.redis.client
        r.flushall()
        run_threads(n, 4, lambda i: self.tasks.noop.apply_async((i,)),
                    lambda k: self.progress(f"Celery: queueing {k:,}/{n:,}"))
        procs = self._workers(workers, pool)
        try:
            wait_until(lambda: r.llen(QUEUE) < n, 60, 0.005, "the first Celery task to be taken")
            began = time.perf_counter()
            while True:
                # Taken off the queue and no longer unacknowledged (acks_late): run.
                done = n - r.llen(QUEUE) - r.hlen("unacked")
                elapsed = time.perf_counter() - began
                if done >= n or elapsed > budget:
                    return done / elapsed
                self.progress(f"Celery ({pool}): {workers} workers, {done:,}/{n:,} run")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.02)
        finally:
            stop_all(procs)

    def delay(self, due: int, window: float, pending: int, workers: int) -> tuple[list[float], float, float]:
        """(lateness in ms of ``due`` ETA tasks spread over ``window`` s, workers' RSS in MiB with
        none pending, with ``pending`` more due in hours)."""
        r = self.redis.client
        r.flushall()
        procs = self._workers(workers, self.variants[0])
        try:
            first = time.time() + 3.0 + due / 300  # Celery publishes a few hundred per second

            def send(i: int) -> None:
                eta = first + window * i / due
                self.tasks.late.apply_async((eta,), eta=_utc(eta))

            run_threads(due, 4, send, lambda k: self.progress(f"Celery: publishing {k:,}/{due:,} ETA tasks"))
            deadline = time.monotonic() + (first - time.time()) + window + 120
            while r.llen("bench:lateness") < due:
                self.progress(f"Celery: {r.llen('bench:lateness'):,}/{due:,} ETA tasks run")
                if time.monotonic() > deadline:
                    raise TimeoutError("Celery ran too few ETA tasks in time")
                time.sleep(0.25)
            lateness = [float(v) for v in r.lrange("bench:lateness", 0, -1)]
            rss_none = sum(tree_rss_mb(p.pid) for p in procs)
            later = time.time() + 3600
            run_threads(pending, 4, lambda i: self.tasks.late.apply_async((later + i,), eta=_utc(later + i)),
                        lambda k: self.progress(f"Celery: publishing {k:,}/{pending:,} tasks due in hours"))
            # Celery workers take ETA tasks off the queue at once and hold them in memory.
            wait_until(lambda: r.llen(QUEUE) == 0, 300, 0.2, "Celery workers to take the pending tasks")
            time.sleep(1.0)  # nothing to wait on: they parse what they took after the queue empties
            rss_pending = sum(tree_rss_mb(p.pid) for p in procs)
            return lateness, rss_none, rss_pending
        finally:
            stop_all(procs)
