"""Saying a fault once: a line when a dependency stops answering and one when it answers again.

A dependency that is away (the database, every broker, ZooKeeper) fails every retry of every
caller, dozens a second. Logging each failure buries the one line that matters under thousands
that say the same thing, so each caller reports its failures to an :class:`Outage` and logs
nothing itself: the outage logs a warning on the first failure after a success, counts the rest,
and logs how long it lasted once a call succeeds again.

A dependency that keeps failing and recovering (connections killed over and over, a broker
restarting in a loop) would still log two lines per flap; failures within ``quiet`` seconds of
the last announced one are therefore only counted, and the next line says how many there were.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

__all__ = ["Outage"]


class Outage:
    """The state of one dependency as its callers see it; ``what`` names the calls in a log line
    ("calls to the database")."""

    def __init__(self, logger: logging.Logger, what: str, quiet: float = 60.0) -> None:
        self._log = logger
        self._what = what
        self._quiet = quiet
        self._lock = threading.Lock()
        self._since: Optional[float] = None  # time.monotonic() of the first failure, None while up
        self._announced_at = float("-inf")  # when a failure was last logged
        self._announced = False  # whether the current outage was logged (then its end is too)
        self._failures = 0  # failed calls of the current outage
        self._unlogged = 0  # failed calls of outages too close to the last announced one

    @property
    def down(self) -> bool:
        """True from the first failure until the next success."""
        return self._since is not None

    def failed(self, error: BaseException) -> bool:
        """Count a failed call; log the first of an outage (unless one was logged within the quiet
        period). True when this call logged."""
        with self._lock:
            self._failures += 1
            if self._since is not None:
                return False
            now = self._since = time.monotonic()
            if now - self._announced_at < self._quiet:
                self._announced = False
                return False
            self._announced, self._announced_at = True, now
            unlogged, self._unlogged = self._unlogged, 0
        more = f" ({unlogged} failed attempts in brief outages before this one were not logged)" if unlogged else ""
        self._log.warning("%s fail: %s: %s; retrying, and saying so again only once one succeeds%s",
                          self._what, type(error).__name__, error, more)
        return True

    def succeeded(self) -> Optional[float]:
        """Note a call that worked; when it ends an outage, return how long it lasted (and log it
        if the outage was logged)."""
        if self._since is None:  # the common case, without the lock: every successful call comes here
            return None
        with self._lock:
            if self._since is None:
                return None
            lasted, failures, announced = time.monotonic() - self._since, self._failures, self._announced
            self._since, self._failures = None, 0
            if not announced:
                self._unlogged += failures
        if announced:
            self._log.info("%s succeed again after %.1f s (%d failed meanwhile)", self._what, lasted, failures)
        return lasted
