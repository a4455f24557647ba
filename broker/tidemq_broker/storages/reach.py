"""Whether this process reaches its database: a database gone silent told from a slow one.

A network partition between one broker and MySQL (a firewall, an address moved to another
server while old connections stay open) answers nothing at all: every statement in flight waits
for a reply until the driver's read timeout (30 s), and every caller of that broker waits out its
deadline there, though another broker may reach the database. A server that is stopped, full or
killing connections answers (refuses, closes) and needs none of this.

``Reach`` counts the units of work in flight. When some have been in flight for ``stall``
seconds and none ended well meanwhile (units that time out one after another end too), it opens
a connection of its own with short timeouts. If the server answers that (even by refusing it,
or its host by refusing the port), the database is only slow, or down for every broker alike
(they all fail fast then, as before). If nothing answers,
the database is out of reach: the connections in use are shut (their statements fail now instead
of at the read timeout), the pools' idle ones are dropped, and every unit of work fails at once
with ``DatabaseOutOfReachError`` without touching the network (the pull hub's looks too, which
then wake the broker's waiting pulls), until a probe, every ``every`` seconds, gets an answer again. The
broker answers such calls UNAVAILABLE, which its clients' pools take as this broker's failure: they
move the call to another broker.

A URL that names several interchangeable servers (a Galera cluster, ``failover.py``) has every
address probed at once, so a probe takes as long with several silent nodes as with one: when the
one in use is silent and another answers (the first in order after it), only that node is out of
this process's reach. The connections in use are shut and the idle ones dropped as
above, new connections go to the node that answered, and the units of work that lost their
connection before their COMMIT run again there.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from sqlalchemy import Engine, event

from ..errors import DatabaseOutOfReachError
from .failover import Addresses

__all__ = ["Reach"]

log = logging.getLogger("tidemq_broker.storages.database")  # the database's own outage lines
#: Error numbers below this one come from the server: it answered, so it can be reached.
_CLIENT_ERRORS = 2000


class Reach:
    """Watches the units of work of ``engines`` (``SqlDatabase`` wraps each in ``with reach:``)."""

    def __init__(self, engines: list[Engine], stall: float = 1.0, every: float = 1.0, probe_timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, watch: bool = True,
                 connect: Optional[Callable[..., Any]] = None, addresses: Optional[Addresses] = None) -> None:
        """``connect(timeout)`` opens a driver connection for a probe (by default one like the
        engines' last new connection, with ``timeout`` seconds to connect, read and write;
        ``connect(timeout, address)`` to one of ``addresses``, the servers a URL names)."""
        self._engines = engines
        self._stall, self._every, self._probe_timeout = stall, every, probe_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight = 0
        self._since = clock()  # the last unit's end, or the start of the oldest one in flight
        self._lost_at: Optional[float] = None
        self._probed_at = 0.0
        self._why = ""
        self._connect = connect or self._connect_like_last
        self._addresses = addresses
        self._last: Optional[tuple[Any, tuple, dict]] = None  # (dbapi, cargs, cparams) of the last connection
        self._in_use: set[Any] = set()  # driver connections checked out of the pools
        self._stopped = threading.Event()
        for engine in engines:
            # A router of several addresses answers do_connect before this (failover.py), and notes it itself.
            event.listen(engine, "do_connect", self._noted)
            event.listen(engine, "checkout", self._checked_out)
            event.listen(engine, "checkin", self._checked_in)
            # A connection invalidated (lost, dropped) is checked in as None: forget it here.
            event.listen(engine, "invalidate", self._invalidated)
        if watch:
            threading.Thread(target=self._watch, name="tidemq-db-reach", daemon=True).start()

    @property
    def out_of_reach(self) -> bool:
        return self._lost_at is not None

    def check(self) -> None:
        """Raise ``DatabaseOutOfReachError`` while the database is out of reach."""
        if self._lost_at is not None:
            raise DatabaseOutOfReachError(self._why)

    def __enter__(self) -> "Reach":
        self.check()
        with self._lock:
            if not self._inflight:
                self._since = self._clock()
            self._inflight += 1
        return self

    def __exit__(self, failed: object, *exc: object) -> None:
        with self._lock:
            self._inflight -= 1
            if failed is None:  # an answer; a unit that failed (timed out, say) is none
                self._since = self._clock()

    def stop(self) -> None:
        self._stopped.set()

    # -- watching --------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped.wait(min(self._stall, self._every) / 4):
            self.tick()

    def tick(self) -> None:
        """One look: a stall probed, or (out of reach) whether a probe gets an answer again."""
        now = self._clock()
        if self._lost_at is not None:
            if now - self._probed_at >= self._every:
                self._probed_at = now
                if self._answers() is None:
                    self._back(now)
            return
        with self._lock:
            stalled = self._inflight > 0 and now - self._since >= self._stall
        if stalled:
            failure = self._answers()
            if failure is None:
                with self._lock:  # only slow: look again after another stall
                    self._since = self._clock()
            else:
                self._lose(now, failure)

    def _answers(self) -> Optional[str]:
        """None when the server answers a new connection (a refusal counts), else why not. With
        several addresses, all probed at once: the one in use, else the first other that answers,
        which new connections then go to (the connections in use are shut: their node is silent)."""
        if self._addresses is None:
            return self._answer()
        order = self._addresses.in_order()
        with ThreadPoolExecutor(len(order), thread_name_prefix="tidemq-db-probe") as probes:
            failures = list(probes.map(self._answer, order))
        if failures[0] is None:
            return None
        for address, failure in zip(order[1:], failures[1:]):  # the one in use is silent
            if failure is None:
                self._addresses.use(address, "gets no answer from this process")
                self._shut_all()
                return None
        return "; ".join(f"{host}:{port}: {failure}" for (host, port), failure in zip(order, failures))

    def _answer(self, *address: tuple[str, int]) -> Optional[str]:
        try:
            conn = self._connect(max(1, round(self._probe_timeout)), *address)
            if conn is None:
                return None  # nothing connected yet: nothing to judge by
        except Exception as exc:  # the driver's errors, socket errors
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            # Refused (the server stopped, its host up) or refused by the server (full, access):
            # an answer, the same for every broker. Only silence is this process's own.
            refused = isinstance(getattr(exc, "original_exception", exc), ConnectionRefusedError)
            return None if refused or (code is not None and code < _CLIENT_ERRORS) else repr(exc)
        try:
            conn.close()
        except Exception:  # it answered: that is all a probe asks
            pass
        return None

    def _lose(self, now: float, failure: str) -> None:
        self._why = (f"this broker gets no answer from the database (nothing back for {self._stall:.0f} s; "
                     f"a new connection: {failure})")
        # Said before the units of work can fail for it: a unit that ends now (its own connect
        # timeout) reads the fault as this broker's and says nothing more (database.py).
        log.warning("%s; calls here fail at once, and clients move to other brokers, until it answers", self._why)
        self._lost_at = self._probed_at = now
        self._shut_all()

    def _shut_all(self) -> None:
        """Fail the statements in flight now, and drop the idle connections."""
        with self._lock:
            in_use = list(self._in_use)
        for dbapi_conn in in_use:
            _shut(dbapi_conn)
        for engine in self._engines:
            engine.dispose(close=False)  # idle pooled connections: dropped without a word on the wire

    def _back(self, now: float) -> None:
        lost_at, self._lost_at = self._lost_at, None
        log.info("the database answers this broker again after %.1f s", now - (lost_at or now))
        with self._lock:
            self._since = self._clock()

    def _connect_like_last(self, timeout: int, address: Optional[tuple[str, int]] = None) -> Any:
        last = self._last or (self._addresses.last if self._addresses is not None else None)
        if last is None:
            return None
        dbapi, cargs, cparams = last
        where = {"host": address[0], "port": address[1]} if address else {}
        return dbapi.connect(*cargs, **{**cparams, **where, "connect_timeout": timeout, "read_timeout": timeout,
                                        "write_timeout": timeout})

    # -- pool events -------------------------------------------------------------------------
    def _noted(self, dialect: Any, record: Any, cargs: tuple, cparams: dict) -> None:
        self._last = (dialect.loaded_dbapi, tuple(cargs), dict(cparams))

    def _checked_out(self, dbapi_conn: Any, record: Any, proxy: Any) -> None:
        with self._lock:
            self._in_use.add(dbapi_conn)

    def _checked_in(self, dbapi_conn: Any, record: Any) -> None:
        with self._lock:
            self._in_use.discard(dbapi_conn)

    def _invalidated(self, dbapi_conn: Any, record: Any, exception: Any) -> None:
        self._checked_in(dbapi_conn, record)


def _shut(dbapi_conn: Any) -> None:
    """Shut a driver connection's socket: a statement waiting on it fails at once."""
    sock = getattr(dbapi_conn, "_sock", None)  # PyMySQL's; a driver without one is left alone
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed
