"""Lease expiry: RUNNING messages whose holder stopped answering go back to NEW, or to FAIL once
they have been delivered their topic's ``max_deliveries`` times (poison messages end)."""

from __future__ import annotations

from typing import Callable, Sequence

from tidemq import clock
from .. import metrics
from ..storage import Storage

__all__ = ["LeaseExpiry"]


class LeaseExpiry:
    """Returns expired leases to NEW in batches, then wakes waiting pulls."""

    name = "lease-expiry"

    def __init__(self, storage: Storage, broker: str, on_requeued: Callable[[Sequence[str]], None],
                 max_deliveries: Callable[[str], int], interval: float = 0.5, batch: int = 1000) -> None:
        self._storage = storage
        self._max_deliveries = max_deliveries
        self._broker = broker
        self._on_requeued = on_requeued
        self.interval = interval
        self._batch = batch

    def run(self) -> int:
        total = 0
        by_topic: dict[str, int] = {}
        while True:
            moved = self._storage.expire_leases(clock.now(), self._batch, self._broker, self._max_deliveries,
                                                by_topic)
            total += moved
            if moved < self._batch:
                break
        metrics.expired(by_topic)
        if total:
            self._on_requeued(sorted(by_topic))  # their messages are NEW again at old effect times
        return total
