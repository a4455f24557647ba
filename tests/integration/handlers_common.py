"""Shared by the model tests and their worker modules: the handler log and process helpers.

A handler appends one line per event to the file named by ``HANDLER_LOG`` with a single
O_APPEND write, so lines from many processes never interleave:
``<id> <pid> <start> <end>`` when a handler finished, ``<id> <pid> <start> -`` when it began
(serial topics log both, so a handler killed mid-message still shows its start).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.servers import wait_until

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]


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
    for raw in path.read_text().splitlines():
        parts = raw.split(" ", 4)
        entries.append(Entry(int(parts[0]), int(parts[1]), float(parts[2]),
                             None if parts[3] == "-" else float(parts[3]), parts[4] if len(parts) > 4 else ""))
    return entries


def start_broker(spawn, tmp_path: Path, name: str, env: dict) -> tuple[object, str]:
    """A real broker process on a free port; returns (process, "127.0.0.1:port") once serving."""
    port_file = tmp_path / f"{name}.port"
    proc = spawn(name, [*TIDEMQ, "broker", "--port", "0", "--port-file", str(port_file)], env)

    def ready():
        if proc.poll() is not None:
            raise RuntimeError(f"broker {name} exited with {proc.returncode}: {proc.log_path.read_text()[-2000:]}")
        return port_file.exists() and port_file.read_text().strip()

    port = wait_until(ready, 60, 0.05, f"broker {name} serving")
    return proc, f"127.0.0.1:{port}"


def start_worker(spawn, name: str, module: str, env: dict):
    """A real ``tidemq worker`` process running ``module``'s consumers."""
    return spawn(name, [*TIDEMQ, "worker", module, "--drain-timeout", "5"], env)


def wait_registered(coordinator, topic: str, count: int, timeout: float = 60) -> list[str]:
    """Wait until exactly ``count`` consumer nodes of ``topic`` are registered."""
    return wait_until(lambda: (lambda nodes: nodes if len(nodes) == count else None)(coordinator.consumers(topic)),
                      timeout, 0.05, f"{count} consumer(s) of {topic} registered")


def kill9(proc) -> float:
    """SIGKILL a process, reap it, return the time it was killed."""
    proc.kill()
    killed_at = time.time()
    proc.wait(10)
    return killed_at


def all_messages(storage, topic: str) -> list:
    """Every stored message of ``topic`` (with its trace), read page by page."""
    from tidemq_broker.storage import MessageFilter

    found: list = []
    before = None
    while True:
        page = storage.list_messages(MessageFilter(topic=topic), 1000, before)
        if not page:
            return found
        found += page
        before = page[-1].id


def count(storage, topic: str, status: str) -> int:
    """How many messages of ``topic`` are in ``status``."""
    return storage.count_by_status(topic).get(topic, {}).get(status, 0)
