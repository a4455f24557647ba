"""``tidemq`` command line: one entry point, one sub-command per component."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Optional, Sequence

from tidemq.config import Settings, has_password, masked_url
from tidemq.errors import ConfigurationError, TidemqError
from tidemq.logs import configure_logging
from tidemq.worker_command import add_worker_options, run_worker

from .cancels import register as register_cancel
from .principals import register as register_auth
from .results import register as register_result
from .topics import register as register_topic
from .principals import run as run_auth
from .schedules import register as register_schedule
from .schedules import run as run_schedule

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidemq",
                                description="tidemq: durable, delay-precise messages on MySQL and ZooKeeper")
    p.add_argument("--db-url", help="SQLAlchemy URL of the store (TIDEMQ_DB_URL)")
    p.add_argument("--zk-hosts", help="ZooKeeper hosts (TIDEMQ_ZK_HOSTS); empty: in-process")
    p.add_argument("--zk-root", help="ZooKeeper root path (TIDEMQ_ZK_ROOT, default /tidemq)")
    p.add_argument("--brokers", help="static broker list host:port,... (TIDEMQ_BROKERS)")
    p.add_argument("--tls-cert", help="PEM certificate of this process (TIDEMQ_TLS_CERT)")
    p.add_argument("--tls-key", help="PEM key of that certificate (TIDEMQ_TLS_KEY)")
    p.add_argument("--tls-ca", help="PEM CA a client verifies brokers with (TIDEMQ_TLS_CA)")
    p.add_argument("--tls-client-ca", help="PEM CA a broker requires client certificates from (TIDEMQ_TLS_CLIENT_CA)")
    p.add_argument("--token-file", help="file holding the client's token (TIDEMQ_TOKEN_FILE); "
                                        "tokens are never taken on the command line")
    p.add_argument("--zk-auth-file", metavar="PATH",
                   help="file whose first line is the ZooKeeper digest user:password (else TIDEMQ_ZK_AUTH)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="everything in one process on SQLite + in-process coordination")
    dev.add_argument("--db", default="tidemq-dev.sqlite3", help="SQLite file (default ./tidemq-dev.sqlite3)")
    dev.add_argument("--port", type=int, default=50051, help="broker gRPC port")
    dev.add_argument("--admin-port", type=int, default=8080, help="admin console port")
    dev.add_argument("--demo", action="store_true", help="produce and consume a demo set of messages, then exit")

    broker = sub.add_parser("broker", help="run a broker")
    broker.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    broker.add_argument("--port", type=int, default=50051, help="gRPC port (0: any free port)")
    broker.add_argument("--advertise", help="host:port clients should use (default host:port)")
    broker.add_argument("--workers", type=int, default=256, help="concurrent RPCs (each long-poll holds one)")
    broker.add_argument("--port-file", help="write the bound port to this file once serving")
    broker.add_argument("--auth", choices=["none", "token"], help="what callers must present (TIDEMQ_AUTH)")
    broker.add_argument("--insecure", action="store_true",
                        help="serve without authentication on a non-loopback address (refused otherwise)")
    add_metrics_port(broker)

    worker = sub.add_parser("worker", help="run the consumers declared in modules")
    worker.add_argument("modules", nargs="+", help="modules to import, e.g. myapp.consumers")
    add_worker_options(worker)

    db = sub.add_parser("db", help="schema management")
    db.add_argument("action", choices=["init", "upgrade"], help="init: create the schema; upgrade: migrate it")

    produce = sub.add_parser("produce", help="produce one message")
    produce.add_argument("topic")
    produce.add_argument("data", help="JSON text")
    produce.add_argument("--delay", type=float, help="seconds before it may run")
    produce.add_argument("--retry", type=int, help="retry count (default: the topic's)")
    produce.add_argument("--unique-key", help="deduplication key")
    produce.add_argument("--key", help="flow key: the topic's per-key running limit counts by it")
    produce.add_argument("--priority", type=int, default=0, help="0 to 9, higher first among due messages")
    register_auth(sub)
    register_topic(sub)
    register_result(sub)
    register_cancel(sub)
    register_schedule(sub)
    for plugin in _PLUGINS:
        module = _optional(plugin)
        if module is not None:
            module.register(sub)
    return p


def add_metrics_port(parser: argparse.ArgumentParser) -> None:
    """The ``--metrics-port`` flag of the long-running commands (TIDEMQ_METRICS_PORT)."""
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics on this HTTP port (TIDEMQ_METRICS_PORT; 0: none)")


#: Components that add their own sub-commands (``admin``, ``pipeline``) when installed. Each
#: module has ``register(subparsers)``; the parser it adds sets ``func(args, settings) -> int``.
_PLUGINS = ("tidemq_admin.cli", "tidemq_pipeline.cli")


def _optional(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None  # the component is not installed
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    configure_logging("text", level)  # until the settings say which format
    try:
        settings = _settings(args)
        configure_logging(settings.log_format, level)
        if args.db_url and has_password(args.db_url):
            # Too late to hide it from `ps` (every local user can read argv), but not too late to say so.
            logging.getLogger("tidemq").warning(
                "--db-url %s carries a password on the command line, where every local user can read it; "
                "set TIDEMQ_DB_URL or TIDEMQ_DB_URL_FILE instead", masked_url(args.db_url))
        handler = _COMMANDS.get(args.command) or args.func
        return handler(args, settings)
    except TidemqError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 2


def _settings(args: argparse.Namespace) -> Settings:
    """The environment's settings with the global flags applied."""
    env = dict(os.environ)
    if args.token_file:
        env["TIDEMQ_TOKEN_FILE"], env["TIDEMQ_TOKEN"] = args.token_file, ""
    return Settings.from_env(env, db_url=args.db_url, zk_hosts=args.zk_hosts, zk_root=args.zk_root,
                             brokers=args.brokers, tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                             tls_client_ca=args.tls_client_ca, auth=getattr(args, "auth", None),
                             zk_auth=_first_line(args.zk_auth_file) if args.zk_auth_file else None,
                             metrics_port=getattr(args, "metrics_port", None))


def _first_line(path: str) -> str:
    # Secrets come from a file, never from argv, where every user of the host can read them.
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().rstrip("\r\n")
    except OSError as exc:
        raise ConfigurationError(f"--zk-auth-file: cannot read {path}: {exc.strerror}") from None


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    if args.demo:
        from .demo import run_demo

        return run_demo(args.db)
    from .dev import run_dev

    return run_dev(args.db, args.port, args.admin_port)


def _broker(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq_broker.server import BrokerServer

    from tidemq import heap, tracing_env
    from tidemq.metrics import serve_metrics

    provider = tracing_env.configure(settings, "tidemq-broker")
    try:
        server = BrokerServer(settings, host=args.host, port=args.port, advertise=args.advertise,
                              workers=args.workers, insecure=args.insecure)
        serve_metrics(settings, "broker")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
        heap.settle(settings.gc)  # what start-up built is never garbage: out of the collector's walks
        if args.port_file:
            with open(args.port_file + ".tmp", "w") as fh:
                fh.write(str(server.port))
            os.replace(args.port_file + ".tmp", args.port_file)
        print(f"tidemq broker serving on {server.address}", flush=True)
        stop.wait()
        server.stop()
        return 0
    finally:
        tracing_env.shutdown(provider)  # the last spans leave before the process does


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    return run_worker(settings, args.modules, drain_timeout=args.drain_timeout, concurrency=args.concurrency,
                      max_idle=args.max_idle)


def _db(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq_broker.migrations import upgrade
    from tidemq_broker.storages import open_storage

    storage = open_storage(settings.db_url)
    try:
        if args.action == "init":
            storage.schema.create_schema()
            print(f"schema created in {masked_url(settings.db_url)}")
        else:
            applied = upgrade(storage.schema)
            print(f"schema upgraded: {', '.join(applied) if applied else 'already current'}")
    finally:
        storage.close()
    return 0


def _produce(args: argparse.Namespace, settings: Settings) -> int:
    from tidemq import Client

    try:
        data = json.loads(args.data)
    except ValueError as exc:
        print(f"tidemq: DATA must be JSON text: {exc}", file=sys.stderr)
        return 2
    client = Client(settings)
    try:
        msg_id = client.produce(args.topic, data, delay=args.delay, retry=args.retry, unique_key=args.unique_key,
                                key=args.key, priority=args.priority)
    finally:
        client.close()
    print(msg_id)
    return 0


_COMMANDS = {"dev": _dev, "broker": _broker, "worker": _worker, "db": _db, "produce": _produce, "auth": run_auth,
             "schedule": run_schedule}

if __name__ == "__main__":
    sys.exit(main())
