"""Backlog gauges: the leader reads every topic's due, scheduled and running counts with one
grouped query every few seconds and publishes them for Prometheus scrapes."""

from __future__ import annotations

from tidemq import clock
from ..metrics import BACKLOG, BacklogCollector
from ..storage import Counts

__all__ = ["BacklogRefresh"]


class BacklogRefresh:
    """Refreshes the backlog gauges while this broker leads; withdraws them when it stops."""

    name = "backlog-gauges"

    def __init__(self, counts: Counts, owner: str, interval: float = 5.0,
                 collector: BacklogCollector = BACKLOG) -> None:
        self._counts = counts
        self._owner = owner
        self.interval = interval
        self._collector = collector

    def run(self) -> int:
        now = clock.now()
        rows = self._counts.backlog(now)
        self._collector.publish(self._owner, rows, now)
        return 0  # a refresh is not work worth a log line

    def stop_leading(self) -> None:
        """Leadership lost or given up: the next leader publishes its own reading."""
        self._collector.withdraw(self._owner)
