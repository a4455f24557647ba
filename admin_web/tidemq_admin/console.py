"""What the views share: the message store, the console's store, cluster liveness and settings."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Optional

from tidemq.config import Settings
from tidemq.coordinator import Coordinator
from tidemq.coordinators import open_coordinator
from tidemq.errors import CoordinationError, TidemqError
from tidemq_broker.release_signals import UNTIMED
from tidemq_broker.storage import Storage
from tidemq_broker.topic_signals import SignalSender

from .security import LoginThrottle

__all__ = ["Console", "ClusterView", "ClusterSnapshot"]

log = logging.getLogger(__name__)


@dataclass
class ClusterSnapshot:
    """Who is online: brokers, the leader, and per topic its consumer nodes (oldest first)."""

    brokers: list[str] = field(default_factory=list)
    leader: Optional[str] = None
    consumers: dict[str, list[str]] = field(default_factory=dict)
    broadcast_topics: set[str] = field(default_factory=set)
    error: Optional[str] = None
    in_process: bool = False


class ClusterView:
    """Reads liveness from the coordinator, connecting on first use (the console starts even
    while ZooKeeper is away, and says so on the cluster page)."""

    def __init__(self, settings: Settings, coordinator: Optional[Coordinator] = None) -> None:
        self._settings = settings
        self._coordinator = coordinator
        self._own = coordinator is None
        self._started = coordinator is not None
        self._brokers: list[str] = []
        self._watching = False
        self._lock = threading.Lock()
        self._due: Optional[SignalSender] = None  # started with the first signal of messages due

    def _connect(self) -> Coordinator:
        with self._lock:
            if self._coordinator is None:
                self._coordinator = open_coordinator(self._settings.zk_hosts, self._settings.zk_root,
                                                     self._settings.zk_session_timeout, auth=self._settings.zk_auth)
            if not self._started:
                self._coordinator.start(timeout=5.0)
                self._started = True
            if not self._watching:
                self._coordinator.watch_brokers(self._on_brokers)
                self._watching = True
            return self._coordinator

    def _on_brokers(self, brokers: list[str]) -> None:
        self._brokers = sorted(brokers)

    def snapshot(self) -> ClusterSnapshot:
        """The current view; ``error`` says what went wrong when the coordinator cannot answer."""
        snap = ClusterSnapshot(in_process=not self._settings.zk_hosts)
        try:
            coordinator = self._connect()
            snap.brokers = list(self._brokers)
            snap.leader = coordinator.leader()
            for topic in coordinator.consumer_topics():
                nodes = coordinator.consumers(topic)
                if nodes:
                    snap.consumers[topic] = nodes
                if coordinator.broadcast_sequences(topic):
                    snap.broadcast_topics.add(topic)
        except TidemqError as exc:
            snap.error = str(exc)
        except Exception as exc:  # a half-open ZooKeeper session: show it rather than fail the page
            log.warning("cluster view failed", exc_info=True)
            snap.error = f"the coordinator did not answer: {exc!r}"
        return snap

    def signal_cancels(self, topics: set[str], wait: float = 2.0) -> bool:
        """Tell the workers of ``topics`` that running messages of theirs were marked cancelled,
        as a broker does (:meth:`tidemq.coordinator.Coordinator.signal_cancel`). False when the
        coordinator could not be reached within ``wait`` seconds: the workers then learn of it
        at their next heartbeat, or when the signal, still on its way, gets through."""
        sent = threading.Event()

        def send() -> None:
            try:
                coordinator = self._connect()  # the session's start, while ZooKeeper is away, takes 5 s
                for topic in sorted(topics):
                    coordinator.signal_cancel(topic)
                sent.set()
            except Exception:  # the mark is stored; only its haste is lost
                log.warning("cannot signal the cancel of running messages of %s to their workers", sorted(topics),
                            exc_info=True)

        # The request waits for the signal a moment, not for a session that cannot start.
        threading.Thread(target=send, name="tidemq-console-cancel-signal", daemon=True).start()
        return sent.wait(wait)

    def signal_due(self, topics: set[str]) -> None:
        """Tell the brokers that messages of ``topics`` became due without a new id (retried,
        edited, or steps released by a cancel, a delete or an edit), as a broker that released
        steps does (:meth:`tidemq.coordinator.Coordinator.signal`): their insert watches do not
        see such a change, so their waiting pulls would find it only by their earliest-due probe,
        up to about a second later. Sent as ``UNTIMED``: an edit to NEW keeps an old effect time,
        so the brokers forget what their lock hints knew of the topic. Sent from a thread of its
        own (``topic_signals.SignalSender``): the request does not wait for ZooKeeper, nor for
        its connection while ZooKeeper is away; a failure is logged once per outage."""
        if not topics:
            return
        with self._lock:
            if self._due is None:
                self._due = SignalSender(self._send_due, "tidemq-console-due-signals", log,
                                         "cannot tell the brokers of messages due now (%s); their probes find them "
                                         "within about a second until this works again",
                                         "telling the brokers of messages due now works again")
                self._due.start()
            due = self._due
        due.send(topics)

    def _send_due(self, topic: str) -> None:
        try:
            self._connect().signal(topic, UNTIMED)
        except CoordinationError:
            raise
        except Exception as exc:  # kazoo's own errors, a start that timed out: one outage to log
            raise CoordinationError(f"cannot signal {topic}: {exc!r}") from None

    def close(self) -> None:
        if self._due is not None:
            self._due.stop()
        if self._own and self._coordinator is not None and self._started:
            self._coordinator.stop()


class Console:
    """Everything a request needs, created once per app by the app factory.

    ``storage`` holds the broker's operations and the console's own roles: ``storage.console``
    (users, pages, dashboard figures) and ``storage.sessions`` (its sign-in state).
    """

    def __init__(self, settings: Settings, storage: Storage, coordinator: Optional[Coordinator] = None) -> None:
        self.settings = settings
        self.storage = storage
        self.cluster = ClusterView(settings, coordinator)
        self.throttle = LoginThrottle(storage.sessions)
