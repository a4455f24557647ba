"""Lateness as each handler saw it: written by the workers, one file per process, read by the benchmark.

A worker calls ``note(ms)`` from its handlers; a thread appends the figures to
``$BENCH_LATENESS_FILE.<pid>`` every 0.2 s (one file per process: appends from two processes
could interleave). The benchmark reads the new lines of every such file with ``LatenessFiles``.
tidemq's workers (benchmarks.consumers) and the PostgreSQL peers' workers share it.
"""

from __future__ import annotations

import glob
import os
import threading
import time

__all__ = ["PREFIX", "note", "LatenessFiles"]

PREFIX = os.environ.get("BENCH_LATENESS_FILE", "")
_late: list[float] = []
_lock = threading.Lock()
_started = False


def _flush_forever(path: str) -> None:
    while True:
        time.sleep(0.2)
        with _lock:
            batch = _late[:]
            _late.clear()
        if batch:
            with open(path, "a") as fh:
                fh.write("".join(f"{ms:.3f}\n" for ms in batch))


def note(ms: float) -> None:
    """Record one lateness in ms (a no-op without ``$BENCH_LATENESS_FILE``)."""
    global _started
    if not PREFIX:
        return
    with _lock:
        _late.append(ms)
        if not _started:  # the first note starts the flusher: after a fork, in the process that runs jobs
            _started = True
            threading.Thread(target=_flush_forever, args=(f"{PREFIX}.{os.getpid()}",), name="bench-lateness",
                             daemon=True).start()


class LatenessFiles:
    """The lateness files under one prefix, and how many lines of each were read already."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen: dict[str, int] = {}

    def new(self) -> list[float]:
        """Every value written since the last ``commit()``."""
        values: list[float] = []
        for path in glob.glob(self.prefix + ".*"):
            with open(path) as fh:
                lines = [line for line in fh if line.strip()]
            values.extend(float(v) for v in lines[self.seen.get(path, 0):])
        return values

    def commit(self) -> None:
        """Mark what is in the files now as read."""
        for path in glob.glob(self.prefix + ".*"):
            with open(path) as fh:
                self.seen[path] = sum(1 for line in fh if line.strip())
