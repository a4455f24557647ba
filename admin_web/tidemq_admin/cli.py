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

from .app import SESSION_IDLE, SESSION_LIFETIME

if TYPE_CHECKING:  # the broker's modules load only when a sub-command runs
    from tidemq_broker.storage import Storage

__all__ = ["register", "serve", "ConsoleServer"]

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
    admin.add_argument("--proxy", action="store_true",
                       help="behind a reverse proxy that terminates HTTPS: trust one proxy's X-Forwarded-For, "
                            "-Proto, -Host and -Prefix headers, and mark the session cookie Secure")
    admin.add_argument("--insecure", action="store_true",
                       help="allow plain HTTP on a non-loopback address (passwords and sessions travel in clear)")
    admin.add_argument("--session-idle", type=float, default=SESSION_IDLE,
                       help=f"seconds a session lasts without a request (default {SESSION_IDLE:.0f})")
    admin.add_argument("--session-lifetime", type=float, default=SESSION_LIFETIME,
                       help=f"seconds a session lasts at most (default {SESSION_LIFETIME:.0f})")
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


def _storage(settings: Settings) -> Storage:
    """The storage (to close; its ``console`` holds the users), with the schema in place."""
    from tidemq_broker.storages import open_storage

    storage = open_storage(settings.db_url)
    storage.schema.create_schema()
    return storage


def _user_add(args: argparse.Namespace, settings: Settings) -> int:
    from .accounts import add_user

    if args.password_stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("tidemq: the passwords differ; nothing was changed", file=sys.stderr)
            return 2
    storage = _storage(settings)
    try:
        created = add_user(storage.console, args.name, password, args.role)
    except ValidationError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 2
    finally:
        storage.close()
    print(f"user {args.name} {'created' if created else 'updated'} with role {args.role}")
    return 0


def _user_list(args: argparse.Namespace, settings: Settings) -> int:
    storage = _storage(settings)
    try:
        for user in storage.console.users():
            print(f"{user.name}\t{user.role}")
    finally:
        storage.close()
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


class ConsoleServer:
    """The console on cheroot, a production WSGI server (a thread pool, HTTP/1.1 keep-alive,
    TLS), serving in a background thread."""

    def __init__(self, app: Any, host: str, port: int, tls: Optional[tuple[str, str]] = None,
                 threads: int = 16) -> None:
        import threading

        from cheroot import wsgi

        self._server = wsgi.Server((host, port), app, numthreads=threads, server_name="tidemq-admin")
        if tls:
            from cheroot.ssl.builtin import BuiltinSSLAdapter

            self._server.ssl_adapter = BuiltinSSLAdapter(*tls)
        self._server.prepare()  # binds now: a taken port fails here, in the caller
        self.port: int = self._server.bind_addr[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(target=self._server.serve, name="tidemq-admin", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting, finish the requests in progress, and return."""
        self._server.stop()
        self._thread.join(10)


def serve(app: Any, host: str, port: int, tls: Optional[tuple[str, str]] = None) -> ConsoleServer:
    """Start serving ``app`` in a background thread; return the server (``.port``, ``.shutdown()``).

    ``tls`` is (certificate file, key file) for HTTPS."""
    return ConsoleServer(app, host, port, tls)


def _tls_files(settings: Settings) -> Optional[tuple[str, str]]:
    """The console's HTTPS certificate and key: this process's TIDEMQ_TLS_CERT / TIDEMQ_TLS_KEY
    (``tidemq --tls-cert C --tls-key K admin``), checked now rather than at a browser's handshake."""
    if not settings.tls_cert:
        return None
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValidationError(f"TIDEMQ_TLS_CERT / TIDEMQ_TLS_KEY: cannot load the certificate and key: "
                              f"{exc.__class__.__name__}: {getattr(exc, 'strerror', None) or exc}") from None
    return settings.tls_cert, settings.tls_key


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    if getattr(args, "admin_command", None):
        return 2
    import signal
    import threading

    from tidemq.metrics import serve_metrics

    from .app import create_app

    try:
        tls = _tls_files(settings)
        if not (tls or args.proxy or args.insecure or _loopback(args.host)):
            raise ValidationError(
                f"refusing to serve the console over plain HTTP on {args.host}: passwords and sessions would "
                "travel in clear. Give `tidemq --tls-cert C --tls-key K admin` (or TIDEMQ_TLS_CERT and "
                "TIDEMQ_TLS_KEY), or --proxy behind a reverse proxy that "
                "terminates HTTPS, or --insecure to serve it anyway")
        if args.session_idle <= 0 or args.session_lifetime <= 0:
            raise ValidationError("--session-idle and --session-lifetime must be positive numbers of seconds")
    except ValidationError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings, secret_key=_secret(args.secret_file), secure_cookies=bool(tls or args.proxy),
                     session_idle=args.session_idle, session_lifetime=args.session_lifetime)
    if args.proxy:
        from werkzeug.middleware.proxy_fix import ProxyFix

        # One proxy in front: its X-Forwarded-* headers name the client's address (the sign-in
        # brake's key), scheme and host. Without --proxy these headers are ignored.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1, x_prefix=1)  # type: ignore[method-assign]
    serve_metrics(settings, "console")
    server = serve(app, args.host, args.port, tls)
    print(f"tidemq admin console on {server.scheme}://{args.host}:{server.port}/", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    app.extensions["tidemq"].cluster.close()
    return 0
