"""What a failed test adds to its report: the last lines of each process it spawned and of each
server it started, stopped or killed, and, when it used the Galera cluster, each node's
membership lines.

A CI machine goes away with its run, and every test's directory with it: the report is all that
is kept, so a failure must carry what explains it (a broker's traceback, a worker's retries, a
cluster that lost its primary component)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["sections", "tail"]

LINES = 60  # per log: a traceback and what led to it
CHARS = 16_000  # read from the end of a log at most, so a runaway log costs the report nothing


def sections(funcargs: dict[str, Any], servers: Iterable[Any] = ()) -> list[tuple[str, str]]:
    """(title, text) pairs for a failed test whose fixture values are ``funcargs`` and that
    started, stopped or killed ``servers`` (``tests.servers.touched()``)."""
    found = []
    for proc in getattr(funcargs.get("spawn"), "procs", ()):
        state = "running" if proc.poll() is None else f"exited {proc.returncode}"
        found.append((f"{proc.name} ({state}): last {LINES} lines of its log", tail(proc.log_path)))
    for server in servers:
        found.append((f"{server.kind} on port {server.port} ({server.state()}), started, stopped or killed "
                      f"in this test: last {LINES} lines of {server.log_name}", server.log_tail()))
    galera = funcargs.get("galera")
    if galera is not None:
        found.append(("Galera nodes: last membership lines", galera.membership_log(nodes=galera.nodes)))
    return found


def tail(path: Path, lines: int = LINES, chars: int = CHARS) -> str:
    """The last ``lines`` lines of the file at ``path`` within its last ``chars`` characters."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            start = max(0, f.tell() - chars)
            f.seek(start)
            found = f.read().decode(errors="replace").splitlines()
    except OSError as exc:
        return f"(unreadable: {exc})"
    if start:  # the first line read was cut
        found = found[1:]
    return "\n".join(found[-lines:]) or "(empty)"
