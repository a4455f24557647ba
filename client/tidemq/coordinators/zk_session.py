"""The ZooKeeper session of a coordinator: what kazoo logs about it, and ending it on purpose."""

from __future__ import annotations

import logging
import time

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from ..errors import CoordinationError

__all__ = ["KazooLog", "expire"]

#: What kazoo logs, as a warning, on every failed attempt to reach ZooKeeper (about once a second
#: while it is away); the coordinator says it once instead.
_RETRY_LINES = ("Connection dropped", "Connection time-out", "Transition to CONNECTING", "Session has expired")


class KazooLog(logging.LoggerAdapter):
    """kazoo's logger for one coordinator: its per-attempt connection warnings go to debug, and
    the latest one is kept as the reason the coordinator gives when it says the connection is
    lost. Everything else kazoo logs passes unchanged."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self.reason = ""

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        if level >= logging.WARNING and isinstance(msg, str) and msg.startswith(_RETRY_LINES):
            if not msg.startswith("Transition"):  # says nothing of why
                try:
                    self.reason = msg % args if args else msg
                except (TypeError, ValueError):
                    self.reason = msg
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)  # type: ignore[arg-type]


def expire(zk: KazooClient, hosts: str, timeout: float) -> None:
    """Make ZooKeeper expire the session of ``zk`` (connected to ``hosts``), as a long partition
    would: fault injection for tests.

    A second connection that joins the session and closes it ends it on the server; ``zk`` then
    sees LOST and reconnects with a new session. The join goes without the chroot (kazoo would
    check the path, and ``zk`` reconnecting can take the session back mid-check), and is repeated
    until ``zk`` holds a new session.
    """
    client_id = zk.client_id
    if client_id is None:
        raise CoordinationError("not connected: there is no session to expire")
    old_session = client_id[0]
    servers = hosts.split("/", 1)[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        twin = KazooClient(hosts=servers, client_id=client_id, timeout=zk._session_timeout / 1000.0)
        try:
            twin.start(timeout=5)
        except (KazooTimeoutError, KazooException):
            pass  # the session moved back to this client first: try again
        finally:
            twin.stop()
            twin.close()
        renewed = time.monotonic() + 5
        while time.monotonic() < renewed:
            current = zk.client_id
            if current is not None and current[0] != old_session:
                return
            time.sleep(0.02)
    raise CoordinationError(f"session {old_session:#x} did not expire within {timeout} s")
