"""Implementations of :class:`tidemq.coordinator.Coordinator`, and the factory that picks one."""

from __future__ import annotations

from ..coordinator import Coordinator

__all__ = ["open_coordinator"]


def open_coordinator(zk_hosts: str, root: str, session_timeout: float = 10.0, auth: str = "") -> Coordinator:
    """The ZooKeeper coordinator for ``zk_hosts``, or the in-process one when it is empty.

    ``session_timeout`` (seconds) is how long a dead process keeps its nodes, so how long its
    QUEUE shard waits before the others take it over; the server bounds it (2x to 20x tickTime).
    ``auth`` (``user:password``) protects the nodes with a digest ACL (see ``ZooKeeperCoordinator``).
    """
    if zk_hosts:
        from .zookeeper import ZooKeeperCoordinator

        return ZooKeeperCoordinator(zk_hosts, root, session_timeout=session_timeout, auth=auth)
    from .local import LocalCoordinator

    return LocalCoordinator(root)
