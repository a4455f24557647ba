"""``--profile DIR``: py-spy samples the brokers and workers while a figure is measured.

Each process gets a collapsed-stack file (``<label>-<pid>.txt``, one ``stack count`` per line,
readable by flamegraph tools); ``top()`` sums them into the functions where CPU time went.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections import Counter
from typing import Iterator, Optional

__all__ = ["profiled", "top"]


@contextlib.contextmanager
def profiled(directory: Optional[str], label: str, pids: dict[str, list[int]]) -> Iterator[None]:
    """Sample every pid of ``pids`` with py-spy while the block runs (no-op without a directory)."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(os.sys.executable), "py-spy")
    if not directory:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    procs = []
    for name, group in pids.items():
        for pid in group:
            out = os.path.join(directory, f"{label}-{name}-{pid}.txt")
            procs.append(subprocess.Popen([spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200",
                                           "--nonblocking"] + (["--gil"] if os.environ.get("SPY_GIL") else [])
                                          + ["--output", out],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def top(path: str, n: int = 25, self_time: bool = True) -> list[tuple[str, float]]:
    """The ``n`` functions with the most samples (own time, or inclusive), as shares of all."""
    counts: Counter[str] = Counter()
    total = 0
    with open(path) as fh:
        for line in fh:
            stack, _, num = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            k = int(num)
            total += k
            frames = stack.split(";")
            if self_time:
                counts[frames[-1]] += k
            else:
                for frame in set(frames):
                    counts[frame] += k
    return [(frame, round(k / total, 3)) for frame, k in counts.most_common(n)] if total else []


if __name__ == "__main__":
    import sys

    for p in sys.argv[1:]:
        print(f"== {p}")
        for frame, share in top(p, self_time="--inclusive" not in sys.argv):
            print(f"{share:6.1%}  {frame}")
