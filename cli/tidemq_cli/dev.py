"""``tidemq dev``: a broker, the example workers (and the console, when installed) in one
process, on a SQLite file and in-process coordination."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading

from tidemq import Client, Settings, Worker
from tidemq.consumer import registered_consumers
from tidemq.coordinators.local import LocalCoordinator
from tidemq_broker.server import BrokerServer

__all__ = ["run_dev", "embedded"]

log = logging.getLogger(__name__)


def embedded(db_path: str, port: int = 0) -> tuple[BrokerServer, Client]:
    """Start a broker on ``db_path`` with in-process coordination; return it and a client."""
    settings = Settings.from_env(db_url=f"sqlite:///{os.path.abspath(db_path)}", zk_hosts="", brokers="")
    coordinator = LocalCoordinator(settings.zk_root)
    coordinator.start()
    broker = BrokerServer(settings, port=port, coordinator=coordinator).start()
    return broker, Client(settings, coordinator=coordinator)


def run_dev(db_path: str, port: int, admin_port: int, demo: bool) -> int:
    if demo:
        from .demo import run_demo

        return run_demo(db_path)
    broker, client = embedded(db_path, port)
    from tidemq_examples import MODULES

    for module in MODULES:
        importlib.import_module(module)
    worker = Worker(registered_consumers(), client=client).start()
    print(f"tidemq dev: broker on {broker.address}, store sqlite:///{os.path.abspath(db_path)}, in-process coordination")
    print(f"tidemq dev: running consumers of {', '.join(s.topic for s in worker.specs)}")
    print("tidemq dev: produce from another shell with "
          f"TIDEMQ_BROKERS={broker.address} tidemq produce example.order.close '{{\"order_id\": 1}}'")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    worker.stop()
    broker.stop()
    return 0
