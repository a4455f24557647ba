"""A server session's last statement: has it ended? For a write whose connection was lost.

An autocommit write (the no-wait lease, ``claims.lease_no_wait``) whose connection breaks while
the statement is on its way has an unknown outcome: the server may have committed it, rolled it
back, or, killed (``KILL CONNECTION``) or cut off mid-statement, still be ending it. Read from
another connection too early, a row it will still change looks untouched. Once the session is
gone from the server's process list, or sits idle there, its statement is over and what it
wrote (or did not) is what any connection reads: the outcome is known again.

MySQL and MariaDB list their sessions in ``information_schema.PROCESSLIST``; a user sees its own
there without any privilege, and the broker's connections are all one user's.
"""

from __future__ import annotations

import time
from typing import Optional

from sqlalchemy import Connection, text

__all__ = ["session_of", "statement_ended"]

_COMMAND = text("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = :id")
#: How often a session still running its statement is looked at again.
_LOOK_EVERY = 0.002


def session_of(conn: Connection) -> Optional[int]:
    """The server's id of ``conn``'s session (MySQL, MariaDB), or None where there is none to
    read. Taken before a write: a lost connection no longer has its driver's."""
    dbapi = conn.connection.dbapi_connection
    ids = getattr(dbapi, "server_thread_id", None)  # PyMySQL's, from the server's handshake
    return int(ids[0]) if ids else None


def statement_ended(conn: Connection, session: int, wait: float) -> bool:
    """Whether ``session`` runs no statement any more (gone from the server, or idle), looked
    at on ``conn`` (another session) for up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        command = conn.execute(_COMMAND, {"id": session}).scalar()
        if command is None or command == "Sleep":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_LOOK_EVERY)  # a killed statement is being rolled back: nothing to wait on but time
