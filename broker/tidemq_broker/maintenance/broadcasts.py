"""Broadcast pruning: broadcast nodes older than the retention period are deleted."""

from __future__ import annotations

from tidemq.coordinator import Coordinator

__all__ = ["BroadcastPruner", "DEFAULT_BROADCAST_RETENTION"]

DEFAULT_BROADCAST_RETENTION = 600.0  # seconds: consumers that were online have long read them


class BroadcastPruner:
    """Keeps ``<root>/broadcast`` small."""

    name = "broadcast-pruning"

    def __init__(self, coordinator: Coordinator, retention: float = DEFAULT_BROADCAST_RETENTION,
                 interval: float = 60.0) -> None:
        self._coordinator = coordinator
        self._retention = retention
        self.interval = interval

    def run(self) -> int:
        return self._coordinator.prune_broadcasts(self._retention)
