"""The autocommit connections ``SqlDatabase`` keeps open per kind of unit of work (reads,
no-wait leases and plain acks, group commits of plain rows): taken and given back by its units
of work, given up to its engine's pool when a transaction finds none there."""

from __future__ import annotations

import threading
from typing import Optional

from sqlalchemy import Connection

__all__ = ["Kept"]


class Kept:
    """Up to ``size`` connections kept open for one kind of unit of work: the idle ones, and how
    many slots have none yet (or lost theirs).

    An idle connection is handed out before an empty slot. A slot whose connection could not be
    opened (the server at ``max_connections``, an outage) comes back empty, and must not hide the
    connections that still work: in a LIFO queue of both, an empty slot given back after a failed
    connect lay on top, so every later unit of work took it, tried to connect and failed, while
    an open connection waited beneath it (the produce path stopped for as long as other clients
    held every connection the server allows).

    The connections come from the engine's pool and stay out of it, so a full server can leave
    the pool with none of its own: a transaction refused a new connection then takes the least
    recently used idle one back to the pool (``surrender``), and a unit of work of this kind
    refused one waits for one of its own to come back (``trade``).
    """

    def __init__(self, size: int) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._idle: list[Connection] = []  # the most recently used last: it is taken first
        self._empty = size

    def take(self, timeout: float) -> Optional[Connection]:
        """An idle connection, else None (an empty slot, for the caller to fill), waiting at most
        ``timeout`` seconds for either; ``TimeoutError`` when every slot stayed in use."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._idle or self._empty, timeout):
                raise TimeoutError(f"every one of the kept connections stayed in use for {timeout} s")
            if self._idle:
                return self._idle.pop()
            self._empty -= 1
            return None

    def idle_count(self) -> int:
        """How many connections are idle now."""
        return len(self._idle)

    def surrender(self) -> Optional[Connection]:
        """Take the least recently used idle connection out for good (its slot becomes empty),
        or None when none is idle."""
        with self._cond:
            if not self._idle:
                return None
            self._empty += 1
            self._cond.notify()
            return self._idle.pop(0)

    def trade(self, timeout: float) -> Optional[Connection]:
        """For an empty slot taken with :meth:`take`, whose connection could not be opened: an
        idle connection, waiting at most ``timeout`` seconds for one (the empty slot goes back),
        or None (the caller keeps its empty slot)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._idle, timeout):
                return None
            self._empty += 1
            self._cond.notify()  # a waiter of ``take`` may have the empty slot
            return self._idle.pop()

    def give(self, conn: Optional[Connection]) -> None:
        """Return a slot taken with :meth:`take`, with its connection, or None if it has none."""
        with self._cond:
            if conn is None:
                self._empty += 1
            else:
                self._idle.append(conn)
            self._cond.notify()

    def idle(self) -> list[Connection]:
        """Take every idle connection out (to close them); their slots become empty."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._empty += len(idle)
            return idle
