"""The Celery peer's app: Redis broker, ``acks_late``, results ignored, two tasks.

``bench.noop`` does nothing (throughput); ``bench.late`` records how late it started against
the ETA it was given, in ms, on the Redis list ``bench:lateness`` (delay accuracy).
"""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_default_queue="bench",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 3600},
)
_redis = None


@app.task(name="bench.noop")
def noop(i: int) -> None:
    """Nothing: the figure is Celery's own cost per task."""


@app.task(name="bench.late")
def late(eta_ts: float) -> None:
    """Push (now - eta) in ms to ``bench:lateness``."""
    global _redis
    started = time.time()
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(app.conf.broker_url)
    _redis.rpush("bench:lateness", f"{(started - eta_ts) * 1000:.3f}")
