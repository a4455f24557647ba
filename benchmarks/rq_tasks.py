"""The RQ peer's job functions: ``noop`` (throughput) and ``late`` (delay accuracy).

``late`` pushes how late it started against the time it was scheduled for, in ms, on the Redis
list ``bench:lateness``.
"""

from __future__ import annotations

import os
import time

_redis = None


def noop(i: int) -> None:
    """Nothing: the figure is RQ's own cost per job."""


def late(eta_ts: float) -> None:
    """Push (now - eta) in ms to ``bench:lateness``."""
    global _redis
    started = time.time()
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _redis.rpush("bench:lateness", f"{(started - eta_ts) * 1000:.3f}")
