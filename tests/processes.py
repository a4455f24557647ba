"""Starting real tidemq processes in tests."""

from __future__ import annotations

import sys

from tests.servers import wait_until

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]


def start_broker_process(spawn, tmp_path, env, name="broker"):
    """Start `tidemq broker` as a real process on a free port; return (process, address)."""
    port_file = tmp_path / f"{name}.port"
    proc = spawn(name, TIDEMQ + ["broker", "--port", "0", "--port-file", str(port_file)], env)

    def port():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {proc.log_path.read_text()[-2000:]}")
        return port_file.exists() and port_file.read_text().strip()

    return proc, f"127.0.0.1:{wait_until(port, 30, what=f'{name} to serve')}"


def process_env(settings, **extra):
    """The environment a tidemq process needs to join the test's cluster."""
    return {"TIDEMQ_DB_URL": settings.db_url, "TIDEMQ_ZK_HOSTS": settings.zk_hosts, **extra}
