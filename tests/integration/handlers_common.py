"""Shared by the model tests and their worker modules: the handler log.

A handler appends one line per event to the file named by ``HANDLER_LOG`` with a single
O_APPEND write, so lines from many processes never interleave:
``<id> <pid> <start> <end>`` when a handler finished, ``<id> <pid> <start> -`` when it began
(serial topics log both, so a handler killed mid-message still shows its start).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional



def record(msg_id: int, start: float, end: Optional[float] = None, extra: str = "") -> None:
    """Append one line to the handler log (a no-op when HANDLER_LOG is unset)."""
    path = os.environ.get("HANDLER_LOG")
    if not path:
        return
    tail = "-" if end is None else f"{end:.6f}"
    line = f"{msg_id} {os.getpid()} {start:.6f} {tail}{' ' + extra if extra else ''}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@dataclass
class Entry:
    """One handler log line."""

    id: int
    pid: int
    start: float
    end: Optional[float]
    extra: str


def read_log(path: Path) -> list[Entry]:
    """Every line of a handler log, in the order written."""
    if not path.exists():
        return []
    entries = []
    text = path.read_text()
    # A handler may be writing its line while we read: a last line without its newline is not
    # complete yet (it is read next time).
    for raw in text[: text.rfind("\n") + 1].splitlines():
        parts = raw.split(" ", 4)
        entries.append(Entry(int(parts[0]), int(parts[1]), float(parts[2]),
                             None if parts[3] == "-" else float(parts[3]), parts[4] if len(parts) > 4 else ""))
    return entries
