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


def start_worker(spawn, name: str, module: str, env: dict):
    """A real ``tidemq worker`` process running ``module``'s consumers."""
    return spawn(name, [*TIDEMQ, "worker", module, "--drain-timeout", "5"], env)


def kill9(proc) -> float:
    """SIGKILL a process, reap it, return the time it was killed."""
    import time

    proc.kill()
    killed_at = time.time()
    proc.wait(10)
    return killed_at


def wait_registered(coordinator, topic: str, count: int, timeout: float = 60) -> list[str]:
    """Wait until exactly ``count`` consumer nodes of ``topic`` are registered."""
    return wait_until(lambda: (lambda nodes: nodes if len(nodes) == count else None)(coordinator.consumers(topic)),
                      timeout, 0.05, f"{count} consumer(s) of {topic} registered")


def process_env(settings, **extra):
    """The environment a tidemq process needs to join the test's cluster."""
    return {"TIDEMQ_DB_URL": settings.db_url, "TIDEMQ_ZK_HOSTS": settings.zk_hosts, **extra}
