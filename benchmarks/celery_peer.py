"""The Celery peer: Redis broker (appendonly on), ``acks_late``, results ignored.

Celery publishes one task per ``apply_async`` (it has no batch publish). Its workers take ETA
tasks off the queue at once and hold them in memory until due, which is why its RSS is read
with tasks pending.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from .env import Cluster, wait_until
from .redis_peer import RedisPeer
from .redis_server import Redis

__all__ = ["CeleryPeer"]

QUEUE = "bench"


def _utc(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


class CeleryPeer(RedisPeer):
    """Celery 5 on Redis; ``variants`` are worker pools (prefork is Celery's default)."""

    name = "Celery"
    ready_text = " ready."

    def __init__(self, redis: Redis, cluster: Cluster, pools: list[str], concurrency: int,
                 progress: Callable[[str], None]) -> None:
        import celery

        super().__init__(redis, cluster, pools, progress)
        self.concurrency = concurrency
        from . import celery_tasks

        app = celery_tasks.app
        if app.conf.broker_url != redis.url:
            # A Redis of an earlier scenario (each starts its own): forget its connections too.
            app.conf.broker_url = redis.url
            app.close()
            app.amqp._producer_pool = None
        self.tasks = celery_tasks
        self.version = f"celery {celery.__version__}"

    def describe(self, variant: str) -> str:
        if variant == "solo":
            return "solo pool (one task at a time per process)"
        unit = "child processes" if variant == "prefork" else "threads"
        return f"{variant} pool, {self.concurrency or 'one per core (Celery default)'} {unit} per worker"

    def command(self, i: int, variant: str) -> list[str]:
        cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_tasks", "worker", "--pool", variant,
               "-Q", QUEUE, "-n", f"bench{i}@%h", "-l", "INFO",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]
        if variant != "solo" and self.concurrency:
            cmd += ["--concurrency", str(self.concurrency)]
        return cmd

    def send(self, i: int, data: Any = None) -> None:
        self.tasks.noop.apply_async((i if data is None else data,))

    def send_at(self, eta: float) -> None:
        self.tasks.late.apply_async((eta,), eta=_utc(eta))

    def waiting(self) -> int:
        return int(self.redis.client.llen(QUEUE))

    def ran(self, n: int) -> int:
        # Taken off the queue and no longer unacknowledged (acks_late): run.
        return n - self.waiting() - int(self.redis.client.hlen("unacked"))

    def settle(self) -> None:
        # Celery workers take ETA tasks off the queue at once and hold them in memory.
        wait_until(lambda: self.waiting() == 0, 300, 0.2, "Celery workers to take the pending tasks")
        time.sleep(1.0)  # nothing to wait on: they parse what they took after the queue empties
