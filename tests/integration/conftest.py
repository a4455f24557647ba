"""Fixtures for integration tests: a broker on real MariaDB + ZooKeeper, clients, processes."""

from __future__ import annotations

import sys

import pytest

from tests.servers import wait_until
from tidemq import Client, Settings

TIDEMQ = [sys.executable, "-m", "tidemq_cli.main"]


@pytest.fixture
def settings(mysql_url, zk_hosts):
    return Settings.from_env({}, db_url=mysql_url, zk_hosts=zk_hosts)


@pytest.fixture
def broker(settings):
    """An in-process broker on MariaDB, registered in this test's ZooKeeper chroot."""
    from tidemq_broker.server import BrokerServer

    server = BrokerServer(settings).start()
    yield server
    server.stop(grace=1)


@pytest.fixture
def client(settings, broker):
    """A client that discovers the broker through ZooKeeper."""
    c = Client(settings)
    wait_until(lambda: broker.address in c.pool.addresses(), 10, what="broker discovery")
    yield c
    c.close()


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
    return {"TIDEMQ_DB_URL": settings.db_url, "TIDEMQ_ZK_HOSTS": settings.zk_hosts, **extra}
