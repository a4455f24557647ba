"""PostgreSQL from Debian on a free port, started and removed by the benchmark (the durable peers' database).

``initdb`` is the slow part (seconds on a busy machine), so it runs once per benchmark process
into a template directory; each server starts on a copy of it. The server keeps PostgreSQL's own
defaults: ``fsync`` and ``synchronous_commit`` on, so the peers are as durable as tidemq.
initdb and postgres refuse to run as root: as root they run as Debian's ``postgres`` user.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from typing import Optional

from .env import wait_until

__all__ = ["PostgreSQL", "bin_dir"]

_template: Optional[str] = None  # the data directory initdb made in this process, copied per server


def bin_dir() -> str:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (the Debian package's server binaries)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run `bash benchmarks/setup.sh` (it installs Debian's "
                           "`postgresql` package)")
    return os.path.dirname(found[-1])


def _owner() -> Optional[pwd.struct_passwd]:
    """The user the server runs as: ``postgres`` when we are root, else ourselves (None)."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def _as_owner(owner: Optional[pwd.struct_passwd]) -> dict:
    return {} if owner is None else {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}


def _chown(path: str, owner: Optional[pwd.struct_passwd]) -> None:
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)


def _initdb() -> str:
    """The template data directory, made on first use and removed when the process exits."""
    global _template
    if _template is None:
        owner = _owner()
        top = tempfile.mkdtemp(prefix="tidemq-bench-pgtemplate-")
        atexit.register(shutil.rmtree, top, True)
        _chown(top, owner)
        data = os.path.join(top, "data")
        # --no-sync only skips flushing initdb's own files: the server's fsync stays on.
        subprocess.run([os.path.join(bin_dir(), "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, **_as_owner(owner))
        _template = data
    return _template


class PostgreSQL:
    """postgres on 127.0.0.1 and a free port, on a fresh copy of the run's template cluster."""

    def __init__(self) -> None:
        from tests.servers import free_port

        template = _initdb()
        owner = _owner()
        self.dir = tempfile.mkdtemp(prefix="tidemq-bench-pg-")
        _chown(self.dir, owner)
        data = os.path.join(self.dir, "data")
        subprocess.run(["cp", "-a", template, data], check=True)  # -a keeps the owner and the 0700 mode
        self.port = free_port()
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir(), "postgres"), "-D", data, "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
             "-c", f"unix_socket_directories={self.dir}"],
            stdout=open(os.path.join(self.dir, "pg.log"), "ab"), stderr=subprocess.STDOUT, **_as_owner(owner))
        try:
            wait_until(self._ready, 60, 0.05, f"PostgreSQL on port {self.port}")
        except BaseException:
            self.cleanup()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {self.proc.returncode}; see {self.dir}/pg.log")
        return subprocess.run([os.path.join(bin_dir(), "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                              capture_output=True).returncode == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def version(self) -> str:
        out = subprocess.run([os.path.join(bin_dir(), "postgres"), "--version"], capture_output=True, text=True).stdout
        return out.split()[2]  # "postgres (PostgreSQL) 15.14 (Debian ...)"

    def pids(self) -> list[int]:
        """The postmaster and every process it runs now (backends, WAL writer, checkpointer, ...)."""
        # One pass over /proc: the backends are the postmaster's children, and walking the tree
        # one /proc scan per process took seconds with 64 backends on a loaded machine.
        found = [self.proc.pid]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        if int(fh.read().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                            found.append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue  # gone while we looked
        return found

    def cleanup(self) -> None:
        """Fast shutdown (SIGINT: open sessions are ended), then remove the cluster's files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
