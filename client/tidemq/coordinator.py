"""The coordination interface: liveness, ranks, leadership and broadcasts.

Two implementations live in ``tidemq.coordinators``: ZooKeeper (production) and in-process
(``tidemq dev`` and unit tests); ``tidemq.coordinators.open_coordinator`` picks one. Both pass
tests/conformance/test_coordination.py.

Node layout under the root (default ``/tidemq``), a contract other tools rely on::

    <root>/brokers/<host:port>                       ephemeral, one per live broker
    <root>/consumers/<topic>/<instance>-<seq>        ephemeral sequential, one per live consumer
    <root>/broadcast/<topic>/m-<seq>                 persistent sequential, one per broadcast
    <root>/leader/                                   the maintenance election
    <root>/signals/<topic>                           persistent; its data set by each release signal
    <root>/cancels/<topic>                           persistent; its data set by each cancel signal
"""

from __future__ import annotations

import abc
import enum
import threading
from typing import Callable, Optional

__all__ = [
    "ConnectionState",
    "Coordinator",
    "Registration",
    "sequence_of",
    "sort_by_sequence",
    "rank_of",
]


class ConnectionState(str, enum.Enum):
    """The session states a coordinator reports to its listeners.

    SUSPENDED: the connection dropped; the session (and our ephemeral nodes) may still live.
    A consumer stops taking new messages until CONNECTED or LOST.
    LOST: the session expired; every ephemeral node is gone and registrations are made anew.
    """

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


def sequence_of(node: str) -> int:
    """The sequence number a sequential node name ends with (``host-12-0000000042`` -> 42)."""
    tail = node.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def sort_by_sequence(nodes: list[str]) -> list[str]:
    """Sort sequential nodes oldest first: by sequence number, then by name."""
    return sorted(nodes, key=lambda n: (sequence_of(n), n))


def rank_of(node: Optional[str], nodes: list[str]) -> tuple[int, int]:
    """Return (rank, total) of ``node`` among ``nodes``; (-1, total) when it is not listed."""
    ordered = sort_by_sequence(nodes)
    total = len(ordered)
    if node is None or node not in ordered:
        return -1, total
    return ordered.index(node), total


class Registration:
    """A consumer's registration; ``node`` changes when a lost session forces a new node."""

    def __init__(self, topic: str, instance: str, node: str) -> None:
        self.topic = topic
        self.instance = instance
        self._node = node
        self._lock = threading.Lock()

    @property
    def node(self) -> str:
        """The current node name (without its path)."""
        with self._lock:
            return self._node

    def _replace(self, node: str) -> None:
        with self._lock:
            self._node = node


class Coordinator(abc.ABC):
    """Everything tidemq keeps outside the database. All times are in seconds."""

    root: str

    @abc.abstractmethod
    def start(self, timeout: float = 15.0) -> None:
        """Connect; raise CoordinationError when that fails within ``timeout``."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Remove this process's registrations and disconnect."""

    @abc.abstractmethod
    def add_state_listener(self, listener: Callable[[ConnectionState], None]) -> None:
        """Call ``listener`` with each session state change (from a coordinator thread)."""

    # -- brokers -------------------------------------------------------------------------
    @abc.abstractmethod
    def register_broker(self, address: str) -> None:
        """Announce a live broker at ``address`` (host:port) until stop() or death."""

    @abc.abstractmethod
    def unregister_broker(self, address: str) -> None:
        """Withdraw a broker's announcement (first step of a clean shutdown)."""

    @abc.abstractmethod
    def watch_brokers(self, callback: Callable[[list[str]], None]) -> None:
        """Call ``callback`` with the live brokers now and after every change."""

    # -- consumers -----------------------------------------------------------------------
    @abc.abstractmethod
    def register_consumer(self, topic: str, instance: str) -> Registration:
        """Create ``<root>/consumers/<topic>/<instance>-<seq>``; re-created after a lost session."""

    @abc.abstractmethod
    def unregister_consumer(self, registration: Registration) -> None:
        """Delete a consumer's node and stop re-creating it."""

    @abc.abstractmethod
    def consumers(self, topic: str) -> list[str]:
        """The live consumer nodes of ``topic``, oldest registration first."""

    @abc.abstractmethod
    def consumer_topics(self) -> list[str]:
        """Topics that have (or had) consumer nodes."""

    @abc.abstractmethod
    def watch_consumers(self, topic: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        """Call ``callback`` with the sorted consumer nodes now and after every change.

        Returns a function that stops the watch.
        """

    # -- broadcasts ----------------------------------------------------------------------
    @abc.abstractmethod
    def broadcast(self, topic: str, payload: bytes) -> int:
        """Store one broadcast under ``topic``; return its sequence number."""

    @abc.abstractmethod
    def broadcast_sequences(self, topic: str) -> list[int]:
        """Sequence numbers of the stored broadcasts of ``topic``, ascending."""

    @abc.abstractmethod
    def read_broadcast(self, topic: str, seq: int) -> Optional[bytes]:
        """The payload of broadcast ``seq``, or None when it was pruned."""

    @abc.abstractmethod
    def watch_broadcasts(self, topic: str, callback: Callable[[list[int]], None]) -> Callable[[], None]:
        """Call ``callback`` with all stored sequence numbers now and after every change.

        The callback always gets the full list, so coalesced events lose nothing.
        Returns a function that stops the watch.
        """

    @abc.abstractmethod
    def prune_broadcasts(self, older_than: float) -> int:
        """Delete broadcasts created more than ``older_than`` seconds ago; return how many."""

    # -- signals -------------------------------------------------------------------------
    @abc.abstractmethod
    def signal(self, topic: str, sender: str = "") -> None:
        """Tell every watcher of ``topic``'s signal that something changed there (brokers: a
        step of the topic was released), naming the ``sender``. Coalesced: watchers learn that it
        changed, not how often."""

    @abc.abstractmethod
    def watch_signal(self, topic: str, callback: Callable[[Optional[str]], None]) -> Callable[[], None]:
        """Call ``callback(sender)`` after each signal of ``topic`` (and possibly once at the
        start). ``sender`` names the sender of the one signal since the previous call, or is None
        when that is not known (the first call, several signals heard as one, an implementation
        that does not tell): a watcher may skip its own signals, never one of None.

        Returns a function that stops the watch.
        """

    @abc.abstractmethod
    def signal_cancel(self, topic: str) -> None:
        """Tell every watcher of ``topic``'s cancel signal that a cancel of running messages of
        the topic was requested (workers then ask at once which of theirs). Coalesced, like
        :meth:`signal`; the request itself is in the database, the signal only hastens it."""

    @abc.abstractmethod
    def watch_cancels(self, topic: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` after each cancel signal of ``topic`` (and possibly once at the
        start). Returns a function that stops the watch."""

    # -- leadership ----------------------------------------------------------------------
    @abc.abstractmethod
    def run_for_leader(self, identifier: str, lead: Callable[[threading.Event], None]) -> Callable[[], None]:
        """Campaign in the background; while elected, run ``lead(lost)``.

        ``lead`` must return soon after ``lost`` is set (leadership lost or campaign ended).
        Returns a function that ends the campaign.
        """

    @abc.abstractmethod
    def leader(self) -> Optional[str]:
        """The identifier of the current leader, if any."""
