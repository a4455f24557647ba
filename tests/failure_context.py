"""What a failed test adds to its report: the last lines of each process it spawned and of each
server it started, stopped or killed, and, when it used the Galera cluster, each node's
membership lines.

A CI machine goes away with its run, and every test's directory with it: the report is all that
is kept, so a failure must carry what explains it (a broker's traceback, a worker's retries, a
cluster that lost its primary component)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

__all__ = ["forget_touched", "ReportedServer", "sections", "tail", "touched"]

LINES = 60  # per log: a traceback and what led to it
CHARS = 16_000  # read from the end of a log at most, so a runaway log costs the report nothing


def sections(funcargs: dict[str, Any], servers: Iterable[ReportedServer] = ()) -> list[tuple[str, str]]:
    """(title, text) pairs for a failed test whose fixture values are ``funcargs`` and that
    started, stopped or killed ``servers`` (``touched()``)."""
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


#: The servers started, stopped or killed since the current test's setup began: a failed test
#: reports their logs. Session servers start in the setup of the first test that needs them, so
#: a server that could not start is reported too.
_touched: list["ReportedServer"] = []


def touched() -> list["ReportedServer"]:
    """The servers started, stopped or killed since ``forget_touched()``, first touched first."""
    return list(_touched)


def forget_touched() -> None:
    """Start a new test's list of touched servers (tests/conftest.py, at each test's setup)."""
    _touched.clear()


class ReportedServer:
    """A server of tests/servers.py as a failed test's report reads it: its kind, port, state
    and log. A subclass calls ``_touch()`` when it starts, stops or is killed, and ``_remove()``
    to delete its directory."""

    kind = "server"
    log_name = ""  # in the server's directory
    reported = True  # False where a report of its own covers the server (a Galera node)
    dir: str
    port: int
    proc: Optional[subprocess.Popen]
    _kept_log: Optional[str] = None  # the log's end, once ``_remove`` deleted the log

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, self.log_name)

    def state(self) -> str:
        """The server's state: "running", "exited N" (0 after a stop's SIGTERM, -9 after a kill) or
        "never started"."""
        if self.proc is None:
            return "never started"
        code = self.proc.poll()
        return "running" if code is None else f"exited {code}"

    def log_tail(self) -> str:
        """The last lines of the server's log, or of what it was when ``_remove`` deleted it."""
        if os.path.exists(self.log_path) or self._kept_log is None:
            return tail(Path(self.log_path))
        return self._kept_log

    def _touch(self) -> None:
        if self.reported and self not in _touched:
            _touched.append(self)

    def _remove(self) -> None:
        """Delete the server's directory, keeping its log's end: a test that stops its own server
        in a ``finally`` removes it before a failure's report is written."""
        self._kept_log = tail(Path(self.log_path))
        shutil.rmtree(self.dir, ignore_errors=True)
