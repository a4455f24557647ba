"""The embedded setup ``tidemq dev`` and ``make demo`` run on: a broker on a SQLite file with
in-process coordination, and a client of it, all in this process."""

from __future__ import annotations

import os
from typing import Optional

from tidemq import Client, Settings
from tidemq.coordinators.local import LocalCoordinator
from tidemq_broker.server import BrokerServer
from tidemq_broker.storage import Storage

__all__ = ["embedded", "embedded_settings"]


def embedded_settings(db_path: str) -> Settings:
    """Settings of the embedded setup: the SQLite file ``db_path``, no ZooKeeper, no broker list."""
    return Settings.from_env(db_url=f"sqlite:///{os.path.abspath(db_path)}", zk_hosts="", brokers="")


def embedded(db_path: str, port: int = 0, storage: Optional[Storage] = None) -> tuple[BrokerServer, Client]:
    """Start a broker on ``db_path`` (or on ``storage``, owned by the caller) with in-process
    coordination; return it and a client."""
    settings = embedded_settings(db_path)
    coordinator = LocalCoordinator(settings.zk_root)
    coordinator.start()
    broker = BrokerServer(settings, port=port, storage=storage, coordinator=coordinator).start()
    return broker, Client(settings, coordinator=coordinator)
