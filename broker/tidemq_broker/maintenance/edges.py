"""Edge retention: the dependency edges of messages no longer stored are deleted, a bounded
sweep per run in child order (see ``storages/edges.py`` for why a sweep, not each delete)."""

from __future__ import annotations

from ..workflow_store import WorkflowStore

__all__ = ["EdgeRetention"]


class EdgeRetention:
    """Sweeps ``tidemq_dependency`` from where its last run stopped: at most ``batches`` looks
    of ``batch`` children per run, so a run stays short on a table of millions of edges, and the
    whole table is swept every few runs. A new leader starts again from the lowest child."""

    name = "edge_retention"

    def __init__(self, dependencies: WorkflowStore, interval: float = 60.0, batch: int = 1000,
                 batches: int = 20) -> None:
        self._dependencies = dependencies
        self.interval = interval
        self._batch = batch
        self._batches = batches
        self._after = 0

    def run(self) -> int:
        deleted = 0
        for _ in range(self._batches):
            self._after, gone = self._dependencies.forget_orphan_edges(self._after, self._batch)
            deleted += gone
            if self._after == 0:  # swept to the end: the next run starts from the lowest
                break
        return deleted
