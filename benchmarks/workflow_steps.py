"""The workflow scenario's worker module: ``tidemq worker benchmarks.workflow_steps``.

Declares one QUEUE consumer of ``$BENCH_TOPIC`` (``$BENCH_THREADS`` handler threads, pulls of
``$BENCH_BATCH``) whose handler does nothing but note its run: it appends
``<id> <pid> <attempt> <start> <end>`` (epoch seconds, the format ``tests/workflow_runs.py``
reads) to ``$BENCH_RECORD_FILE`` with one O_APPEND write, so the lines of both workers share
one file without interleaving. The scenario reads from it when each step started and ended.
"""

from __future__ import annotations

import os
import time

from tidemq import Message, mq_consumer

TOPIC = os.environ.get("BENCH_TOPIC", "bench.workflow")
THREADS = int(os.environ.get("BENCH_THREADS", "4"))
BATCH = int(os.environ.get("BENCH_BATCH", "500")) or None
RECORD_FILE = os.environ["BENCH_RECORD_FILE"]

_fd = os.open(RECORD_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
_PID = os.getpid()


@mq_consumer(TOPIC, threads=THREADS, batch=BATCH, ttr=120)
def handle(message: Message) -> None:
    """A no-op step: records its start and end."""
    start = time.time()
    os.write(_fd, f"{message.id} {_PID} {message.attempt} {start:.6f} {time.time():.6f}\n".encode())
