"""``tidemq dev``: a broker, the example workers (and the console, when installed) in one
process, on a SQLite file and in-process coordination."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading

from tidemq import Worker
from tidemq.consumer import registered_consumers
from tidemq_broker.server import BrokerServer
from tidemq_broker.storage import Storage
from tidemq_broker.storages import open_storage

from .embedded import embedded, embedded_settings

__all__ = ["run_dev"]

log = logging.getLogger(__name__)


def _owner_only(db_path: str) -> None:
    """The dev database holds the console's password hashes: an older file readable by others
    is narrowed to its owner (0600), with the files SQLite keeps beside it."""
    for path in (db_path, db_path + "-wal", db_path + "-shm"):
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(path, 0o600)
            print(f"tidemq dev: {path} was readable by others (mode {mode:o}); now 0600")


def run_dev(db_path: str, port: int, admin_port: int) -> int:
    """Run ``tidemq dev`` until SIGTERM or SIGINT; return the exit status."""
    # One store for the broker and the console: the console's pages and the broker's writes go
    # through the same database object (SQLite takes one writer at a time).
    storage = open_storage(embedded_settings(db_path).db_url)  # a new file is created 0600
    _owner_only(db_path)
    broker, client = embedded(db_path, port, storage)
    from tidemq_examples import MODULES

    for module in MODULES:
        importlib.import_module(module)
    worker = Worker(registered_consumers(), client=client).start()
    console = _start_console(broker, storage, admin_port)
    print(f"tidemq dev: broker on {broker.address}, store sqlite:///{os.path.abspath(db_path)}, "
          "in-process coordination")
    print(f"tidemq dev: running consumers of {', '.join(s.topic for s in worker.specs)}")
    print("tidemq dev: produce from another shell with "
          f"TIDEMQ_BROKERS={broker.address} tidemq produce example.order.close '{{\"order_id\": 1}}'")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if console is not None:
        console.shutdown()
    worker.stop()
    broker.stop()
    storage.close()
    return 0


def _start_console(broker: BrokerServer, storage: Storage, port: int):  # type: ignore[no-untyped-def]
    """Serve the admin console on ``port`` over the broker's own store and coordinator.

    Without TIDEMQ_ADMIN_USER an ``admin`` user with a fresh random password is made (and
    printed) the first time, so the dev console can be opened at once.
    """
    try:
        from tidemq_admin.app import create_app
        from tidemq_admin.cli import serve
    except ModuleNotFoundError:  # the [admin] extra is not installed
        return None
    import secrets

    from tidemq_admin.accounts import add_user

    app = create_app(broker.settings, storage=storage, coordinator=broker.coordinator)
    admin = app.extensions["tidemq"].storage.console
    if not broker.settings.admin_user and not admin.users():
        password = secrets.token_urlsafe(12)
        add_user(admin, "admin", password, "admin")
        print(f"tidemq dev: console user admin, password {password} (made once; "
              "`tidemq admin user add admin --role admin` resets it)")
    server = serve(app, "127.0.0.1", port)
    print(f"tidemq dev: admin console on http://127.0.0.1:{server.port}/")
    return server
