"""Lease expiry: RUNNING messages whose holder stopped answering go back to NEW, or to FAIL once
they have been delivered their topic's ``max_deliveries`` times (poison messages end).

A lease that runs out while the database itself is away says nothing about its holder: every
heartbeat failed, however alive the worker, and a handler that finished meanwhile still holds its
outcome. Expiring such leases the moment the database returns would run those messages a second
time. So the job remembers when it last reached the database; the first run after an outage
holds every lease that ran out since then until the database's return plus the lease's own ttr
(``OutageGrace``), time enough for the holder's next heartbeats or its kept outcome to arrive.
Leases that ran out before the outage, or whose holder stays silent past that, expire as usual.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable, Optional, Sequence

from tidemq import clock
from tidemq.limits import MAX_TTR
from .. import metrics
from ..errors import StorageUnavailableError
from ..storage import Leasing, OutageGrace

__all__ = ["LeaseExpiry"]

#: Where a job that never reached the database starts its grace: it cannot know when the outage
#: began, so every lease found run out at the database's return is held.
_EVER = datetime(1970, 1, 1)


class LeaseExpiry:
    """Returns expired leases to NEW in batches, then wakes waiting pulls."""

    name = "lease-expiry"

    def __init__(self, leases: Leasing, broker: str, on_requeued: Callable[[Sequence[str]], None],
                 max_deliveries: Callable[[str], int], interval: float = 0.5, batch: int = 1000) -> None:
        self._leases = leases
        self._max_deliveries = max_deliveries
        self._broker = broker
        self._on_requeued = on_requeued
        self.interval = interval
        self._batch = batch
        self._looked: Optional[datetime] = None  # when a run last reached the database
        self._away_since: Optional[datetime] = None  # set from the first failed run until one succeeds
        self.grace: Optional[OutageGrace] = None  # the last outage's, while any lease may still need it

    def run(self) -> int:
        now = clock.now()
        grace = self._grace_at(now)
        total = 0
        by_topic: dict[str, int] = {}
        try:
            while True:
                moved = self._leases.expire_leases(now, self._batch, self._broker, self._max_deliveries,
                                                    by_topic, grace)
                total += moved
                if moved < self._batch:
                    break
        except StorageUnavailableError:
            if self._away_since is None:
                self._away_since = self._looked or _EVER
            raise
        self._looked, self._away_since, self.grace = now, None, grace
        metrics.expired(by_topic)
        if total:
            self._on_requeued(sorted(by_topic))  # their messages are NEW again at old effect times
        return total

    def _grace_at(self, now: datetime) -> Optional[OutageGrace]:
        """The grace this run applies: the last outage's (until no lease can need it any more),
        or, on the first run after an outage, one from its start to now (merged with a grace
        still running, so a lease held by the first is not released by the second)."""
        grace = self.grace
        if grace is not None and now - grace.back > timedelta(seconds=MAX_TTR):
            grace = None
        if self._away_since is not None:
            since = self._away_since if grace is None else min(grace.since, self._away_since)
            grace = OutageGrace(since, now)
        return grace

    def stop_leading(self) -> None:
        # Another broker may look meanwhile: what this one last saw says nothing about the next
        # outage. A grace in force stays: the leases it holds are still owed their time.
        self._looked = None
        self._away_since = None
