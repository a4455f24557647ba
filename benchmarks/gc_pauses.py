"""The cycle collector's pauses in the brokers and workers of a benchmark run.

``env(prefix)`` is what those processes' environment gets: ``benchmarks/gc_watch`` first on
``PYTHONPATH``, whose ``sitecustomize`` records every collection of 2 ms or more to files named
after ``prefix``; ``read(prefix)`` gathers them per role and ``summary`` sums them up for a
window of the run.
"""

from __future__ import annotations

import glob
import os
from typing import Optional

__all__ = ["env", "read", "summary"]

_WATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gc_watch")


def env(prefix: str) -> dict[str, str]:
    """Environment entries that make a child process record its collections under ``prefix``."""
    path = os.environ.get("PYTHONPATH", "")
    return {"BENCH_GC_FILE": prefix, "PYTHONPATH": _WATCH + (os.pathsep + path if path else "")}


def read(prefix: str) -> dict[str, list[tuple[float, int, float]]]:
    """Each role's recorded pauses as ``(epoch, generation, ms)``, every process of it together."""
    found: dict[str, list[tuple[float, int, float]]] = {}
    for path in glob.glob(f"{glob.escape(prefix)}.*.*"):
        role = path[len(prefix) + 1:].split(".")[0]
        pauses = found.setdefault(role, [])
        with open(path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3 and parts[0] != "short":
                    pauses.append((float(parts[0]), int(parts[1]), float(parts[2])))
    return found


def summary(pauses: dict[str, list[tuple[float, int, float]]], start: float, end: float,
            over_ms: float = 10.0) -> dict[str, dict[str, Optional[float]]]:
    """Per role, the pauses of 2 ms or more between ``start`` and ``end`` (epoch s): how many,
    how many of ``over_ms`` or more, the longest, and their total per second of the window."""
    out: dict[str, dict[str, Optional[float]]] = {}
    seconds = max(end - start, 1e-9)
    for role, found in sorted(pauses.items()):
        inside = [ms for t, _, ms in found if start <= t < end]
        out[role] = {"pauses": len(inside), f"over {over_ms:g} ms": sum(1 for ms in inside if ms >= over_ms),
                     "max ms": round(max(inside), 1) if inside else None,
                     "ms per s": round(sum(inside) / seconds, 2)}
    return out
