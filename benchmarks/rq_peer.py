"""The RQ peer: Redis broker (appendonly on), ``rq worker --with-scheduler``.

RQ enqueues one job per ``enqueue`` and a batch in one pipeline with ``enqueue_many``. Its default
worker forks a work horse per job; ``SimpleWorker`` runs jobs in the worker process itself.
Scheduled jobs (``enqueue_at``) wait in a Redis sorted set, scored in whole seconds, that a
scheduler moves to the queue once a second; workers hold none of them in memory.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from .env import Cluster, run_threads
from .redis_peer import RedisPeer
from .redis_server import Redis

__all__ = ["RQPeer"]

QUEUE = "bench"
_CLASSES = {"fork": "rq.Worker", "simple": "rq.worker.SimpleWorker"}


class RQPeer(RedisPeer):
    """RQ on Redis; ``variants`` are worker classes (fork is RQ's default)."""

    name = "RQ"
    ready_text = "Listening on"
    publish_rate = 500.0

    def __init__(self, redis: Redis, cluster: Cluster, variants: list[str], progress: Callable[[str], None]) -> None:
        import rq
        from rq import Queue

        from . import rq_tasks

        super().__init__(redis, cluster, variants, progress)
        self.queue = Queue(QUEUE, connection=redis.client)
        self.tasks = rq_tasks
        self.version = f"rq {rq.__version__}"

    def describe(self, variant: str) -> str:
        return {"fork": "default Worker (forks a work horse per job)",
                "simple": "SimpleWorker (runs jobs in the worker process)"}[variant]

    def command(self, i: int, variant: str) -> list[str]:
        return [os.path.join(os.path.dirname(sys.executable), "rq"), "worker", "--url", self.redis.url,
                "--with-scheduler", "--worker-class", _CLASSES[variant], "--name", f"bench-{variant}-{i}", QUEUE]

    def send(self, i: int, data: Any = None) -> None:
        self.queue.enqueue(self.tasks.noop, i if data is None else data)

    def send_at(self, eta: float) -> None:
        self.queue.enqueue_at(datetime.fromtimestamp(eta, tz=timezone.utc), self.tasks.late, eta)

    def waiting(self) -> int:
        return self.queue.count

    def ran(self, n: int) -> int:
        from rq.registry import FinishedJobRegistry

        return FinishedJobRegistry(queue=self.queue).get_job_count(cleanup=False)

    def settle(self) -> None:
        time.sleep(2.0)  # two scheduler intervals: it has looked at the pending jobs by then

    def produce_batched(self, n: int, threads: int, batch: int) -> Optional[float]:
        """Jobs enqueued per second with ``enqueue_many`` of ``batch`` jobs from ``threads`` threads."""
        from rq import Queue

        self.redis.client.flushall()
        calls = (n + batch - 1) // batch
        if not calls:
            return 0.0

        def send(c: int) -> None:
            self.queue.enqueue_many([Queue.prepare_data(self.tasks.noop, (c * batch + j,))
                                     for j in range(min(batch, n - c * batch))])

        per_second = run_threads(calls, threads, send, lambda k: self.progress(f"RQ: enqueue_many {k * batch:,}/{n:,}"))
        return n * per_second / calls
