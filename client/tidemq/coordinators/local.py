"""The in-process coordinator: for ``tidemq dev`` and unit tests, one process only.

Every LocalCoordinator with the same root shares one tree held by this module, so a broker and
workers started in one process see each other as they would through ZooKeeper. Callbacks run on
one dispatcher thread, like kazoo's event thread, so they never run under the caller's locks.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..coordinator import ConnectionState, Coordinator, Registration, sort_by_sequence

__all__ = ["LocalCoordinator"]

log = logging.getLogger(__name__)


@dataclass
class _Tree:
    """The shared state of one root."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    brokers: set[str] = field(default_factory=set)
    consumers: dict[str, set[str]] = field(default_factory=dict)
    broadcasts: dict[str, dict[int, tuple[float, bytes]]] = field(default_factory=dict)
    counters: dict[str, itertools.count] = field(default_factory=dict)
    watchers: dict[str, list[Callable[..., None]]] = field(default_factory=dict)  # a signal's: (sender)
    candidates: list[str] = field(default_factory=list)
    leader_changed: threading.Condition = field(default_factory=lambda: threading.Condition(threading.RLock()))

    def next_seq(self, key: str) -> int:
        return next(self.counters.setdefault(key, itertools.count()))


_TREES: dict[str, _Tree] = {}
_TREES_LOCK = threading.Lock()
_EVENTS: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
_DISPATCHER: Optional[threading.Thread] = None
_TOKENS = itertools.count()


def _dispatch_forever() -> None:
    while True:
        fn = _EVENTS.get()
        try:
            fn()
        except Exception:  # a watcher's bug must not stop the other watchers
            log.exception("coordination watcher failed")


def _post(fn: Callable[[], None]) -> None:
    global _DISPATCHER
    with _TREES_LOCK:
        if _DISPATCHER is None:
            _DISPATCHER = threading.Thread(target=_dispatch_forever, name="tidemq-local-coord", daemon=True)
            _DISPATCHER.start()
    _EVENTS.put(fn)


def reset_local_state() -> None:
    """Forget every in-process tree (tests call this between cases)."""
    with _TREES_LOCK:
        _TREES.clear()


class LocalCoordinator(Coordinator):
    """In-process coordination with the same observable behaviour as ZooKeeper's, for one process."""

    def __init__(self, root: str = "/tidemq") -> None:
        self.root = root
        with _TREES_LOCK:
            self._tree = _TREES.setdefault(root, _Tree())
        self._mine_brokers: set[str] = set()
        self._mine_consumers: list[Registration] = []
        self._listeners: list[Callable[[ConnectionState], None]] = []
        self._campaigns: list[Callable[[], None]] = []
        self._leading: list[threading.Event] = []

    def start(self, timeout: float = 15.0) -> None:
        self._announce(ConnectionState.CONNECTED)

    def stop(self) -> None:
        for end in list(self._campaigns):
            end()
        for address in list(self._mine_brokers):
            self.unregister_broker(address)
        for reg in list(self._mine_consumers):
            self.unregister_consumer(reg)

    def add_state_listener(self, listener: Callable[[ConnectionState], None]) -> None:
        self._listeners.append(listener)

    def expire_session(self) -> None:
        """Fault injection: what a ZooKeeper session expiry does to this process.

        Listeners see LOST, every node of ours disappears (others see them leave), leadership
        ends, then listeners see CONNECTED and brokers and consumers register again with new nodes.
        """
        tree = self._tree
        with tree.leader_changed:
            for lost in self._leading:
                lost.set()
            tree.leader_changed.notify_all()
        with tree.lock:
            for address in self._mine_brokers:
                tree.brokers.discard(address)
            topics = {reg.topic for reg in self._mine_consumers}
            for reg in self._mine_consumers:
                tree.consumers.get(reg.topic, set()).discard(reg.node)
        self._changed("brokers")
        for topic in topics:
            self._changed("consumers/" + topic)
        self._announce(ConnectionState.LOST)
        with tree.lock:
            tree.brokers.update(self._mine_brokers)
            for reg in self._mine_consumers:
                node = f"{reg.instance}-{tree.next_seq('consumers/' + reg.topic):010d}"
                tree.consumers.setdefault(reg.topic, set()).add(node)
                reg._replace(node)
        self._announce(ConnectionState.CONNECTED)
        self._changed("brokers")
        for topic in topics:
            self._changed("consumers/" + topic)

    def suspend(self) -> None:
        """Fault injection: what a lost ZooKeeper connection does while the session lives on.
        Listeners see SUSPENDED; nodes, ranks and leadership stay as they were."""
        self._announce(ConnectionState.SUSPENDED)

    def resume(self) -> None:
        """Fault injection: the connection is back (listeners see CONNECTED)."""
        self._announce(ConnectionState.CONNECTED)

    def _announce(self, state: ConnectionState) -> None:
        for listener in list(self._listeners):
            _post(lambda listener=listener: listener(state))

    # -- watch plumbing ----------------------------------------------------------------------
    def _changed(self, key: str, *args: str) -> None:
        with self._tree.lock:
            watchers = list(self._tree.watchers.get(key, ()))
        for notify in watchers:
            _post(functools.partial(notify, *args) if args else notify)

    def _watch(self, key: str, notify: Callable[..., None]) -> Callable[[], None]:
        with self._tree.lock:
            self._tree.watchers.setdefault(key, []).append(notify)
        _post(notify)

        def stop() -> None:
            with self._tree.lock:
                if notify in self._tree.watchers.get(key, []):
                    self._tree.watchers[key].remove(notify)

        return stop

    # -- brokers -----------------------------------------------------------------------------
    def register_broker(self, address: str) -> None:
        with self._tree.lock:
            self._tree.brokers.add(address)
            self._mine_brokers.add(address)
        self._changed("brokers")

    def unregister_broker(self, address: str) -> None:
        with self._tree.lock:
            self._tree.brokers.discard(address)
            self._mine_brokers.discard(address)
        self._changed("brokers")

    def watch_brokers(self, callback: Callable[[list[str]], None]) -> None:
        def notify() -> None:
            with self._tree.lock:
                current = sorted(self._tree.brokers)
            callback(current)

        self._watch("brokers", notify)

    # -- consumers ---------------------------------------------------------------------------
    def register_consumer(self, topic: str, instance: str) -> Registration:
        with self._tree.lock:
            node = f"{instance}-{self._tree.next_seq('consumers/' + topic):010d}"
            self._tree.consumers.setdefault(topic, set()).add(node)
            reg = Registration(topic, instance, node)
            self._mine_consumers.append(reg)
        self._changed("consumers/" + topic)
        return reg

    def unregister_consumer(self, registration: Registration) -> None:
        with self._tree.lock:
            self._tree.consumers.get(registration.topic, set()).discard(registration.node)
            if registration in self._mine_consumers:
                self._mine_consumers.remove(registration)
        self._changed("consumers/" + registration.topic)

    def consumers(self, topic: str) -> list[str]:
        with self._tree.lock:
            return sort_by_sequence(list(self._tree.consumers.get(topic, ())))

    def consumer_topics(self) -> list[str]:
        with self._tree.lock:
            return sorted(self._tree.consumers)

    def watch_consumers(self, topic: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        return self._watch("consumers/" + topic, lambda: callback(self.consumers(topic)))

    # -- broadcasts --------------------------------------------------------------------------
    def broadcast(self, topic: str, payload: bytes) -> int:
        with self._tree.lock:
            seq = self._tree.next_seq("broadcast/" + topic)
            self._tree.broadcasts.setdefault(topic, {})[seq] = (time.time(), bytes(payload))
        self._changed("broadcast/" + topic)
        return seq

    def broadcast_sequences(self, topic: str) -> list[int]:
        with self._tree.lock:
            return sorted(self._tree.broadcasts.get(topic, {}))

    def read_broadcast(self, topic: str, seq: int) -> Optional[bytes]:
        with self._tree.lock:
            entry = self._tree.broadcasts.get(topic, {}).get(seq)
        return entry[1] if entry else None

    def watch_broadcasts(self, topic: str, callback: Callable[[list[int]], None]) -> Callable[[], None]:
        return self._watch("broadcast/" + topic, lambda: callback(self.broadcast_sequences(topic)))

    def prune_broadcasts(self, older_than: float) -> int:
        cutoff = time.time() - older_than
        pruned = 0
        with self._tree.lock:
            for entries in self._tree.broadcasts.values():
                for seq in [s for s, (created, _) in entries.items() if created < cutoff]:
                    del entries[seq]
                    pruned += 1
        return pruned

    # -- signals -----------------------------------------------------------------------------
    def signal(self, topic: str, sender: str = "") -> None:
        self._changed("signal/" + topic, sender)

    def watch_signal(self, topic: str, callback: Callable[[Optional[str]], None]) -> Callable[[], None]:
        # Each signal is its own call, naming its sender; the first call (the watch's start) names none.
        return self._watch("signal/" + topic, lambda sender=None: callback(sender))

    def signal_cancel(self, topic: str) -> None:
        self._changed("cancel/" + topic)

    def watch_cancels(self, topic: str, callback: Callable[[], None]) -> Callable[[], None]:
        return self._watch("cancel/" + topic, callback)

    # -- leadership --------------------------------------------------------------------------
    def run_for_leader(self, identifier: str, lead: Callable[[threading.Event], None]) -> Callable[[], None]:
        tree = self._tree
        ended = threading.Event()
        current: list[threading.Event] = []  # this campaign's turn, for end()

        def campaign() -> None:
            # Like kazoo's election: queue up, lead while first, and queue up again at the back
            # when leadership ends (lead returned or the session was lost) until the campaign ends.
            while not ended.is_set():
                lost = threading.Event()
                token = f"{identifier}#{next(_TOKENS)}"
                with tree.leader_changed:
                    tree.candidates.append(token)
                    self._leading.append(lost)
                    current[:] = [lost]
                    while not ended.is_set() and not lost.is_set() and tree.candidates[0] != token:
                        tree.leader_changed.wait(0.5)
                try:
                    if not ended.is_set() and not lost.is_set():
                        lead(lost)
                finally:
                    with tree.leader_changed:
                        if token in tree.candidates:
                            tree.candidates.remove(token)
                        if lost in self._leading:
                            self._leading.remove(lost)
                        tree.leader_changed.notify_all()
                ended.wait(0.05)

        threading.Thread(target=campaign, name="tidemq-local-election", daemon=True).start()

        def end() -> None:
            ended.set()
            with tree.leader_changed:
                for lost in current:
                    lost.set()
                tree.leader_changed.notify_all()
            if end in self._campaigns:
                self._campaigns.remove(end)

        self._campaigns.append(end)
        return end

    def leader(self) -> Optional[str]:
        with self._tree.leader_changed:
            return self._tree.candidates[0].rsplit("#", 1)[0] if self._tree.candidates else None
