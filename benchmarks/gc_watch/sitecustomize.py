"""Records the cycle collector's pauses of the brokers and workers a benchmark starts.

This directory goes first on those processes' ``PYTHONPATH`` (``benchmarks.gc_pauses``), so
Python imports this module as it starts. With ``$BENCH_GC_FILE`` set, every collection that
takes at least ``MIN_MS`` of wall time appends ``epoch generation milliseconds`` to
``$BENCH_GC_FILE.<broker|worker>.<pid>``; shorter ones are only counted, and the counts are
written at exit. The wall time is what the process's other threads waited: the GIL is held.
"""

import atexit
import gc
import os
import sys
import time

MIN_MS = 2.0


def _watch(prefix: str) -> None:
    role = "broker" if "broker" in sys.argv else "worker" if "worker" in sys.argv else "other"
    fd = os.open(f"{prefix}.{role}.{os.getpid()}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    began = [0.0]
    short = [0, 0, 0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - began[0]) * 1000
        if ms >= MIN_MS:
            os.write(fd, f"{time.time():.6f} {info['generation']} {ms:.2f}\n".encode())
        else:
            short[info["generation"]] += 1

    def at_exit() -> None:
        os.write(fd, f"short {short[0]} {short[1]} {short[2]}\n".encode())

    atexit.register(at_exit)
    gc.callbacks.append(callback)


if os.environ.get("BENCH_GC_FILE"):
    _watch(os.environ["BENCH_GC_FILE"])
