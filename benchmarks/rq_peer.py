"""The RQ peer: Redis broker (appendonly on), ``rq worker --with-scheduler`` processes started here.

RQ enqueues one job per ``enqueue`` and a batch in one pipeline with ``enqueue_many``. Its default
worker forks a work horse per job; ``SimpleWorker`` runs jobs in the worker process itself. Its
consume is timed from the first job taken to every job finished. Scheduled jobs
(``enqueue_at``) wait in a Redis sorted set that a scheduler moves to the queue once a second.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from typing import Callable, Optional

from .env import Cluster, Proc, run_threads, stop_all, tree_rss_mb, wait_until
from .redis_server import Redis

__all__ = ["RQPeer"]

QUEUE = "bench"
_CLASSES = {"fork": "rq.Worker", "simple": "rq.worker.SimpleWorker"}


class RQPeer:
    """RQ on Redis. ``variants`` are worker classes; the first is the one reported first."""

    name = "RQ"

    def __init__(self, redis: Redis, cluster: Cluster, variants: list[str], progress: Callable[[str], None]) -> None:
        import rq
        from rq import Queue

        from . import rq_tasks

        self.redis, self.cluster, self.progress = redis, cluster, progress
        self.variants = variants
        self.queue = Queue(QUEUE, connection=redis.client)
        self.tasks = rq_tasks
        self.version = f"rq {rq.__version__}"

    def describe(self, variant: str) -> str:
        return {"fork": "default Worker (forks a work horse per job)",
                "simple": "SimpleWorker (runs jobs in the worker process)"}[variant]

    def _workers(self, count: int, variant: str) -> list[Proc]:
        rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
        procs = [Proc(f"rq-{variant}-{i}", [rq_bin, "worker", "--url", self.redis.url, "--with-scheduler",
                                             "--worker-class", _CLASSES[variant], "--name", f"bench-{variant}-{i}", QUEUE],
                      {"BENCH_REDIS_URL": self.redis.url}, self.cluster.dir) for i in range(count)]

        def ready() -> bool:
            for proc in procs:
                proc.check_alive()
            return all("Listening on" in open(p.log_path, errors="replace").read() for p in procs)

        wait_until(ready, 90, 0.1, f"{count} RQ workers")
        return procs

    def produce(self, n: int, threads: int) -> float:
        """Jobs enqueued per second, one ``enqueue`` per job from ``threads`` threads."""
        self.redis.client.flushall()
        return run_threads(n, threads, lambda i: self.queue.enqueue(self.tasks.noop, i),
                           lambda k: self.progress(f"RQ: enqueueing {k:,}/{n:,}"))

    def produce_batched(self, n: int, threads: int, batch: int) -> Optional[float]:
        """Jobs enqueued per second with ``enqueue_many`` of ``batch`` jobs from ``threads`` threads."""
        from rq import Queue

        self.redis.client.flushall()
        calls = (n + batch - 1) // batch

        def send(c: int) -> None:
            self.queue.enqueue_many([Queue.prepare_data(self.tasks.noop, (c * batch + j,))
                                     for j in range(min(batch, n - c * batch))])

        if not calls:
            return 0.0
        per_second = run_threads(calls, threads, send, lambda k: self.progress(f"RQ: enqueue_many {k * batch:,}/{n:,}"))
        return n * per_second / calls

    def _finished(self) -> int:
        from rq.registry import FinishedJobRegistry

        return FinishedJobRegistry(queue=self.queue).get_job_count(cleanup=False)

    def consume(self, n: int, workers: int, variant: str, budget: float) -> float:
        """No-op jobs finished per second by ``workers`` worker processes of ``variant``, over ``n``
        jobs or ``budget`` seconds, whichever ends first."""
        self.produce_batched(n, 4, 100)
        procs = self._workers(workers, variant)
        try:
            wait_until(lambda: self.queue.count < n, 60, 0.005, "the first RQ job to be taken")
            began = time.perf_counter()
            while True:
                done = self._finished()
                elapsed = time.perf_counter() - began
                if done >= n or elapsed > budget:
                    return done / elapsed
                self.progress(f"RQ ({variant}): {workers} workers, {done:,}/{n:,} finished")
                for proc in procs:
                    proc.check_alive()
                time.sleep(0.02)
        finally:
            stop_all(procs)

    def delay(self, due: int, window: float, pending: int, workers: int) -> tuple[list[float], float, float]:
        """(lateness in ms of ``due`` scheduled jobs spread over ``window`` s, workers' RSS in MiB
        with none pending, with ``pending`` more due in hours)."""
        r = self.redis.client
        r.flushall()
        procs = self._workers(workers, self.variants[0])
        try:
            first = time.time() + 3.0 + due / 500

            def at(ts: float) -> datetime:
                return datetime.fromtimestamp(ts, tz=timezone.utc)

            def send(i: int) -> None:
                eta = first + window * i / due
                self.queue.enqueue_at(at(eta), self.tasks.late, eta)

            run_threads(due, 4, send, lambda k: self.progress(f"RQ: scheduling {k:,}/{due:,} jobs"))
            deadline = time.monotonic() + (first - time.time()) + window + 120
            while r.llen("bench:lateness") < due:
                self.progress(f"RQ: {r.llen('bench:lateness'):,}/{due:,} scheduled jobs run")
                if time.monotonic() > deadline:
                    raise TimeoutError("RQ ran too few scheduled jobs in time")
                time.sleep(0.25)
            lateness = [float(v) for v in r.lrange("bench:lateness", 0, -1)]
            rss_none = sum(tree_rss_mb(p.pid) for p in procs)
            later = time.time() + 3600
            run_threads(pending, 4, lambda i: self.queue.enqueue_at(at(later + i), self.tasks.late, later + i),
                        lambda k: self.progress(f"RQ: scheduling {k:,}/{pending:,} jobs due in hours"))
            time.sleep(2.0)  # two scheduler intervals: it has looked at the pending jobs by then
            rss_pending = sum(tree_rss_mb(p.pid) for p in procs)
            return lateness, rss_none, rss_pending
        finally:
            stop_all(procs)
