"""Broadcasts in ZooKeeper: ``<root>/broadcast/<topic>/m-<seq>``, persistent sequential nodes
that every online TOPIC consumer reads in sequence order, pruned by age on ZooKeeper's clock."""

from __future__ import annotations

import posixpath
from typing import Callable, Optional

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from ..coordinator import sequence_of
from ..errors import CoordinationError
from .zk_acl import hint

__all__ = ["ZkBroadcasts"]


class ZkBroadcasts:
    """The broadcasts under ``base``. ``clock_path`` is where a node is made to read ZooKeeper's
    time; ``delete`` and ``watch`` are the coordinator's (a delete that waits for no
    reconnection, a children watch that can be ended)."""

    def __init__(self, zk: KazooClient, base: str, clock_path: str, delete: Callable[[str], int],
                 watch: Callable[[str, Callable[[list[str]], None]], Callable[[], None]]) -> None:
        self._zk = zk
        self._base = base
        self._clock_path = clock_path
        self._delete = delete
        self._watch = watch

    def send(self, topic: str, payload: bytes) -> int:
        try:
            path = self._zk.create(posixpath.join(self._base, topic, "m-"), payload, sequence=True, makepath=True)
        except KazooException as exc:
            raise CoordinationError(f"cannot store the broadcast of {topic}: {exc!r}{hint(exc)}") from None
        return sequence_of(posixpath.basename(path))

    def sequences(self, topic: str) -> list[int]:
        try:
            return sorted(sequence_of(c) for c in self._zk.get_children(posixpath.join(self._base, topic)))
        except NoNodeError:
            return []
        except KazooException as exc:
            raise CoordinationError(f"cannot list the broadcasts of {topic}: {exc!r}") from None

    def read(self, topic: str, seq: int) -> Optional[bytes]:
        try:
            data, _ = self._zk.get(posixpath.join(self._base, topic, f"m-{seq:010d}"))
        except NoNodeError:
            return None
        except KazooException as exc:
            raise CoordinationError(f"cannot read broadcast {seq} of {topic}: {exc!r}") from None
        return data

    def watch(self, topic: str, callback: Callable[[list[int]], None]) -> Callable[[], None]:
        path = posixpath.join(self._base, topic)
        self._zk.ensure_path(path)
        return self._watch(path, lambda children: callback(sorted(sequence_of(c) for c in children)))

    def prune(self, older_than: float) -> int:
        try:
            return self._prune(older_than)
        except KazooException as exc:  # ZooKeeper away: said once by the connection's outage
            raise CoordinationError(f"cannot prune broadcasts: {exc!r}") from None

    def _prune(self, older_than: float) -> int:
        pruned = 0
        cutoff_ms = None
        for topic in self._zk.get_children(self._base):
            for child in self._zk.get_children(posixpath.join(self._base, topic)):
                path = posixpath.join(self._base, topic, child)
                stat = self._zk.exists(path)
                if stat is None:
                    continue
                if cutoff_ms is None:
                    cutoff_ms = self._server_now_ms(stat) - older_than * 1000
                if stat.ctime < cutoff_ms:
                    pruned += self._delete(path)
        return pruned

    def _server_now_ms(self, fallback: object) -> float:
        # ctime is ZooKeeper's clock: compare against a node created now, not our clock.
        path = self._zk.create(self._clock_path, b"", ephemeral=True, sequence=True)
        stat = self._zk.exists(path)
        self._delete(path)
        return stat.ctime if stat else getattr(fallback, "ctime", 0)
