"""Several database addresses in one URL, and moving to another when the one in use stops serving.

A Galera cluster (or any set of interchangeable MySQL servers) is named in one URL, the way
MariaDB's own connectors do it::

    mysql+pymysql://user:pw@db1:3306,db2:3306,db3:3306/tidemq

Every new connection goes to the address in use; when it refuses, or it is a Galera node that is
not ``Synced`` (joining, donating, or cut off from the primary component), the next address is
tried and becomes the one in use. A broker therefore writes through one node at a time (writes
spread over several nodes only add certification conflicts) and moves when that node dies.

Connections already open to a dead node fail on their next use; SQLAlchemy then invalidates the
whole pool, and ``SqlDatabase.tx`` runs the unit of work again on a fresh connection, which this
module sends elsewhere. A node that answers but has left the primary component (error 1047) is
reported to SQLAlchemy as a disconnect for the same effect.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Optional

from sqlalchemy import Engine, event

from ..errors import ConfigurationError, quote

__all__ = ["Addresses", "mark_not_serving_as_disconnect", "split_addresses"]

log = logging.getLogger(__name__)

# scheme://[userinfo@]hosts[/database][?query]; the userinfo may hold "@" (percent-encoded or not),
# so it runs to the last "@" before the path.
_URL = re.compile(r"^(?P<scheme>[^:/]+://)(?:(?P<userinfo>.*)@)?(?P<hosts>[^@/?]*)(?P<rest>[/?].*)?$")
_NOT_SERVING = {1047}  # WSREP has not yet prepared node for application use (non-primary, joining)


def split_addresses(url: str, default_port: int = 3306) -> tuple[str, list[tuple[str, int]]]:
    """The URL with only its first address, and every ``(host, port)`` it names, in order.

    Raises ``ConfigurationError`` for an address that is not ``host`` or ``host:port``.
    """
    match = _URL.match(url)
    if not match or "," not in match["hosts"]:
        return url, []
    addresses = []
    for part in match["hosts"].split(","):
        host, _, port = part.strip().partition(":")
        if not host or (port and not port.isdigit()) or (port and not 0 < int(port) < 65536):
            raise ConfigurationError(
                f"TIDEMQ_DB_URL names an address {quote(part.strip())} that is not host or host:port "
                "(expected mysql+pymysql://user:pw@host1:3306,host2:3306/db)")
        addresses.append((host, int(port) if port else default_port))
    first = f"{addresses[0][0]}:{addresses[0][1]}"
    userinfo = f"{match['userinfo']}@" if match["userinfo"] is not None else ""
    return f"{match['scheme']}{userinfo}{first}{match['rest'] or ''}", addresses


class Addresses:
    """The database addresses of one URL and the one new connections go to."""

    def __init__(self, addresses: list[tuple[str, int]]) -> None:
        self.addresses = addresses
        self._current = 0
        self._lock = threading.Lock()
        #: (dbapi, cargs, cparams) of the last new connection: what a reach probe connects with.
        self.last: Optional[tuple[Any, tuple, dict]] = None

    @property
    def current(self) -> tuple[str, int]:
        """The address new connections go to."""
        return self.addresses[self._current]

    def in_order(self) -> list[tuple[str, int]]:
        """Every address, the one in use first."""
        return [self.addresses[index] for index in self._indexes()]

    def _indexes(self) -> list[int]:
        """Every address's index, the one in use first, then those after it (wrapping round)."""
        start = self._current
        return [(start + step) % len(self.addresses) for step in range(len(self.addresses))]

    def use(self, address: tuple[str, int], why: str) -> None:
        """Send new connections to ``address`` from now on (``why``: what was found of the one in use)."""
        with self._lock:
            if self.addresses[self._current] != address:
                log.warning("database %s:%s %s; using %s:%s", *self.current, why, *address)
                self._current = self.addresses.index(address)

    def attach(self, engine: Engine) -> None:
        """Route ``engine``'s new connections through these addresses."""
        event.listen(engine, "do_connect", self._connect)

    def _connect(self, dialect: Any, record: Any, cargs: tuple, cparams: dict[str, Any]) -> Any:
        self.last = (dialect.loaded_dbapi, tuple(cargs), dict(cparams))
        indexes = self._indexes()
        start = indexes[0]
        failures = []
        for index in indexes:
            host, port = self.addresses[index]
            try:
                conn = dialect.loaded_dbapi.connect(*cargs, **{**cparams, "host": host, "port": port})
            except dialect.loaded_dbapi.OperationalError as exc:
                failures.append(f"{host}:{port}: {exc.args[-1] if exc.args else exc}")
                continue
            state = _galera_state(conn)
            if state not in (None, "Synced"):
                conn.close()
                failures.append(f"{host}:{port}: Galera node is {state}")
                continue
            if index != self._current:
                with self._lock:
                    if self._current == start:
                        log.warning("database %s:%s is not serving (%s); using %s:%s", *self.addresses[start],
                                    "; ".join(failures) or "moved", host, port)
                    self._current = index
            return conn
        raise dialect.loaded_dbapi.OperationalError(
            2003, "no database address is serving: " + "; ".join(failures))


def _galera_state(conn: Any) -> Any:
    """``wsrep_local_state_comment`` of a Galera node (``Synced``, ``Joining``...); None for a
    server that is not a Galera node (MySQL, or MariaDB without a cluster: no such state)."""
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state_comment', 'wsrep_ready')")
        status = dict(cur.fetchall())
    state = status.get("wsrep_local_state_comment")
    if not state:
        return None
    return state if status.get("wsrep_ready") == "ON" else f"{state}, not ready"


def mark_not_serving_as_disconnect(engine: Engine) -> None:
    """Treat "node not serving" errors as a lost connection, so the pool is renewed."""

    @event.listens_for(engine, "handle_error")
    def _handle(context: Any) -> None:
        args = getattr(context.original_exception, "args", ())
        if args and args[0] in _NOT_SERVING:
            context.is_disconnect = True
