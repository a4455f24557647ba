"""The benchmark's worker module: ``tidemq worker benchmarks.consumers``.

Declares one no-op QUEUE consumer of ``$BENCH_TOPIC``. With ``$BENCH_LATENESS_FILE`` set, each
handler call records how late it ran (now - effect_time, in ms) and a flusher thread appends the
figures to that file, so the benchmark reads lateness as the handler saw it.
"""

from __future__ import annotations

import os
import threading
import time

from tidemq import Message, mq_consumer

TOPIC = os.environ.get("BENCH_TOPIC", "bench.consume")
THREADS = int(os.environ.get("BENCH_THREADS", "4"))
BATCH = int(os.environ.get("BENCH_BATCH", "500"))
LATENESS_FILE = os.environ.get("BENCH_LATENESS_FILE", "")

_late: list[float] = []
_lock = threading.Lock()


def _flush_forever(path: str) -> None:
    while True:
        time.sleep(0.2)
        with _lock:
            batch = _late[:]
            _late.clear()
        if batch:
            with open(path, "a") as fh:
                fh.write("".join(f"{ms:.3f}\n" for ms in batch))


if LATENESS_FILE:  # one file per process: appends from two processes could interleave
    threading.Thread(target=_flush_forever, args=(f"{LATENESS_FILE}.{os.getpid()}",), name="bench-lateness", daemon=True).start()


@mq_consumer(TOPIC, threads=THREADS, batch=BATCH, ttr=120)
def noop(message: Message) -> None:
    """Does nothing, so the figure is the queue's own cost; optionally notes its lateness."""
    if LATENESS_FILE and message.effect_time is not None:
        late = (time.time() - message.effect_time.timestamp()) * 1000
        with _lock:
            _late.append(late)
