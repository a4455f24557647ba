"""``tidemq admin`` (serve the console) and ``tidemq admin user add NAME --role ...``."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Optional

from tidemq.config import Settings
from tidemq.errors import ValidationError

if TYPE_CHECKING:  # the broker's modules load only when a sub-command runs
    from tidemq_broker.storages.admin_sql import AdminSqlStore
    from tidemq_broker.storages.database import SqlDatabase

__all__ = ["register", "serve"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add the ``admin`` sub-command to the ``tidemq`` parser."""
    admin = subparsers.add_parser("admin", help="the admin console (web) and its users")
    admin.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    admin.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    admin.add_argument("--secret-file", help="file holding the session signing key (created if missing); "
                                             "share it between console processes behind one address")
    admin.add_argument("--metrics-port", type=int,
                       help="serve Prometheus metrics on this HTTP port (TIDEMQ_METRICS_PORT; 0: none)")
    admin.set_defaults(func=_serve)
    sub = admin.add_subparsers(dest="admin_command")
    user = sub.add_parser("user", help="manage console users")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    add = user_sub.add_parser("add", help="create a user, or reset its password and role")
    add.add_argument("name")
    add.add_argument("--role", choices=["admin", "viewer"], default="viewer",
                     help="admin may change things, viewer may only look (default viewer)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.set_defaults(func=_user_add)
    lst = user_sub.add_parser("list", help="list users and their roles")
    lst.set_defaults(func=_user_list)


def _store(settings: Settings) -> tuple[SqlDatabase, AdminSqlStore]:
    """The database (to close) and the console's store over it, with the schema in place."""
    from tidemq_broker.storages import open_database
    from tidemq_broker.storages.admin_sql import AdminSqlStore
    from tidemq_broker.storages.sql import SqlStorage

    db = open_database(settings.db_url)
    SqlStorage(db).create_schema()
    return db, AdminSqlStore(db)


def _user_add(args: argparse.Namespace, settings: Settings) -> int:
    from .accounts import add_user

    if args.password_stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("tidemq: the passwords differ; nothing was changed", file=sys.stderr)
            return 2
    db, store = _store(settings)
    try:
        created = add_user(store, args.name, password, args.role)
    except ValidationError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 2
    finally:
        db.close()
    print(f"user {args.name} {'created' if created else 'updated'} with role {args.role}")
    return 0


def _user_list(args: argparse.Namespace, settings: Settings) -> int:
    db, store = _store(settings)
    try:
        for user in store.users():
            print(f"{user.name}\t{user.role}")
    finally:
        db.close()
    return 0


def _secret(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(32).hex())
    with open(path) as fh:
        return fh.read().strip()


def serve(app: Any, host: str, port: int) -> Any:
    """Start serving ``app`` in a background thread; return the server (``.port``, ``.shutdown()``)."""
    import threading

    from werkzeug.serving import make_server

    server = make_server(host, port, app, threaded=True)
    threading.Thread(target=server.serve_forever, name="tidemq-admin", daemon=True).start()
    return server


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    if getattr(args, "admin_command", None):
        return 2
    import signal
    import threading

    from tidemq.metrics import serve_metrics

    from .app import create_app

    app = create_app(settings, secret_key=_secret(args.secret_file))
    serve_metrics(settings, "console")
    server = serve(app, args.host, args.port)
    print(f"tidemq admin console on http://{args.host}:{server.port}/", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    app.extensions["tidemq"].cluster.close()
    return 0
