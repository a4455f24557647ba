"""redis-server from Debian on a free port, started and removed by the benchmark (the peers' broker)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile

from .env import wait_until

__all__ = ["Redis"]


class Redis:
    """redis-server on 127.0.0.1 and a free port, append-only file on (fsync every second)."""

    def __init__(self) -> None:
        from tests.servers import free_port

        self.dir = tempfile.mkdtemp(prefix="tidemq-bench-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--save", "", "--daemonize", "no", "--protected-mode", "no"],
            stdout=open(os.path.join(self.dir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        wait_until(self._ready, 30, 0.05, f"redis-server on port {self.port}")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.dir}/redis.log")
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        return out.split()[2][2:]

    def cleanup(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
