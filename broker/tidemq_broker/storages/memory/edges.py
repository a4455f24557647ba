"""The retention of dependency edges in memory, as ``storages/edges.py`` does it in SQL."""

from __future__ import annotations

from .state import MemoryState

__all__ = ["MemoryEdges"]


class MemoryEdges:
    """``forget_orphan_edges`` of the dependencies role."""

    _state: MemoryState

    def forget_orphan_edges(self, after: int, limit: int) -> tuple[int, int]:
        state = self._state
        with state.lock:
            children = sorted(child for child in state.parents if child > after)[:limit]
            if not children:
                return 0, 0
            deleted = 0
            for child in children:
                if child in state.messages:
                    continue
                for parent in state.parents.pop(child):
                    kids = state.children.get(parent)
                    if kids is not None:
                        kids.discard(child)
                        if not kids:
                            del state.children[parent]
                    deleted += 1
            return children[-1], deleted
