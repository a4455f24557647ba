"""What the peers on Redis share: their workers' start and stop, and the produce, consume and
delay workloads. A peer only says how to start one worker, publish a job, publish a delayed job
and count what has run.

Consume is timed from the first job taken to the last one run (or ``budget`` seconds), so worker
start-up is not counted. Delayed jobs record how late they started (now - due time, ms) on the
Redis list ``bench:lateness``; RSS is read over each worker's process tree.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .env import Cluster, Proc, run_threads, stop_all, tree_rss_mb, wait_until
from .redis_server import Redis

__all__ = ["RedisPeer", "LATENESS"]

LATENESS = "bench:lateness"


class RedisPeer:
    """A job queue on Redis measured beside tidemq. ``variants`` are worker configurations; the
    first is the peer's default and the one the targets use."""

    name = ""
    ready_text = ""  # what a worker's log says once it takes jobs
    publish_rate = 300.0  # delayed jobs published per second, roughly: when the first may be due

    def __init__(self, redis: Redis, cluster: Cluster, variants: list[str], progress: Callable[[str], None]) -> None:
        self.redis, self.cluster, self.progress = redis, cluster, progress
        self.variants = variants
        self.version = ""

    # -- what each peer says -----------------------------------------------------------------
    def describe(self, variant: str) -> str:
        raise NotImplementedError

    def command(self, i: int, variant: str) -> list[str]:
        """The command line of worker ``i`` of ``variant``."""
        raise NotImplementedError

    def send(self, i: int, data: Any = None) -> None:
        """Publish one no-op job; its argument is ``data`` if given, else ``i``."""
        raise NotImplementedError

    def send_at(self, eta: float) -> None:
        """Publish one job due at unix time ``eta`` that records its lateness."""
        raise NotImplementedError

    def ran(self, n: int) -> int:
        """How many of the ``n`` no-op jobs queued have run."""
        raise NotImplementedError

    def waiting(self) -> int:
        """Jobs still in the queue, not taken by any worker."""
        raise NotImplementedError

    def settle(self) -> None:
        """Wait until the workers have seen the jobs just published as pending."""

    def produce_batched(self, n: int, threads: int, batch: int) -> Optional[float]:
        """Jobs published per second in batches of ``batch``; None if the peer has no batch publish."""
        return None

    # -- the workloads -----------------------------------------------------------------------
    def workers(self, count: int, variant: str) -> list[Proc]:
        """``count`` workers of ``variant``, started and taking jobs."""
        procs = [Proc(f"{self.name.lower()}-{variant}-{i}", self.command(i, variant),
                      {"BENCH_REDIS_URL": self.redis.url}, self.cluster.dir) for i in range(count)]

        def ready() -> bool:
            for proc in procs:
                proc.check_alive()
            return all(self.ready_text in open(p.log_path, errors="replace").read() for p in procs)

        try:
            wait_until(ready, 90, 0.1, f"{count} {self.name} workers")
        except BaseException:
            stop_all(procs)
            raise
        return procs

    def produce(self, n: int, threads: int) -> float:
        """Jobs published per second, one call per job from ``threads`` threads."""
        self.redis.client.flushall()
        return run_threads(n, threads, self.send, lambda k: self.progress(f"{self.name}: publishing {k:,}/{n:,}"))

    def consume(self, n: int, workers: int, variant: str, budget: float) -> float:
        """No-op jobs run per second by ``workers`` workers of ``variant``, over ``n`` jobs or
        ``budget`` seconds, whichever ends first."""
        self.produce(n, 4)
        procs = self.workers(workers, variant)
        try:
            wait_until(lambda: self.waiting() < n, 60, 0.005, f"the first {self.name} job to be taken")
            began = time.perf_counter()
            while True:
                done = self.ran(n)
                elapsed = time.perf_counter() - began
                if done >= n or elapsed > budget:
                    return done / elapsed
                self.progress(f"{self.name} ({variant}): {workers} workers, {done:,}/{n:,} run")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.02)
        finally:
            stop_all(procs)

    def delay(self, due: int, window: float, pending: int, workers: int) -> tuple[list[float], float, float]:
        """(lateness in ms of ``due`` jobs spread over ``window`` s, the workers' RSS in MiB with
        none pending, with ``pending`` more due in hours)."""
        r = self.redis.client
        r.flushall()
        procs = self.workers(workers, self.variants[0])
        try:
            first = time.time() + 3.0 + due / self.publish_rate
            run_threads(due, 4, lambda i: self.send_at(first + window * i / due),
                        lambda k: self.progress(f"{self.name}: publishing {k:,}/{due:,} delayed jobs"))
            deadline = time.monotonic() + (first - time.time()) + window + 120
            while r.llen(LATENESS) < due:
                self.progress(f"{self.name}: {r.llen(LATENESS):,}/{due:,} delayed jobs run")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} ran too few delayed jobs in time")
                time.sleep(0.25)
            lateness = [float(v) for v in r.lrange(LATENESS, 0, -1)]
            rss_none = sum(tree_rss_mb(p.pid) for p in procs)
            later = time.time() + 3600
            run_threads(pending, 4, lambda i: self.send_at(later + i),
                        lambda k: self.progress(f"{self.name}: publishing {k:,}/{pending:,} jobs due in hours"))
            self.settle()
            rss_pending = sum(tree_rss_mb(p.pid) for p in procs)
            return lateness, rss_none, rss_pending
        finally:
            stop_all(procs)
