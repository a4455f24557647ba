"""Leadership through ZooKeeper: kazoo's Election under ``<root>/leader/election``, held for as
long as the session lives (not only the connection)."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from ..coordinator import ConnectionState

__all__ = ["ZkLeadership"]

# The coordinator's logger: an operator who tunes what ZooKeeperCoordinator logs tunes this too.
log = logging.getLogger("tidemq.coordinators.zookeeper")


class ZkLeadership:
    """The election of one coordinator; ``listeners`` is the coordinator's list of session state
    listeners, which a leader joins while it leads."""

    def __init__(self, zk: KazooClient, path: str, listeners: list[Callable[[ConnectionState], None]]) -> None:
        self._zk = zk
        self._path = path
        self._listeners = listeners

    def run_for_leader(self, identifier: str, lead: Callable[[threading.Event], None]) -> Callable[[], None]:
        """See :meth:`tidemq.coordinator.Coordinator.run_for_leader`."""
        election = self._zk.Election(self._path, identifier)
        ended = threading.Event()

        def campaign() -> None:
            while not ended.is_set():
                try:
                    election.run(self._lead_while_session_lives, lead, ended)
                except KazooException:
                    # Without a connection every attempt fails alike; the outage is logged once.
                    level = logging.WARNING if self._zk.connected else logging.DEBUG
                    log.log(level, "leader election interrupted; campaigning again", exc_info=True)
                ended.wait(0.5)

        threading.Thread(target=campaign, name="tidemq-election", daemon=True).start()

        def end() -> None:
            ended.set()
            election.cancel()

        return end

    def _lead_while_session_lives(self, lead: Callable[[threading.Event], None], ended: threading.Event) -> None:
        # Leadership ends with the session (LOST), not with the connection (SUSPENDED): while the
        # connection is away nobody else can be elected before the session expires, so the
        # leader goes on running its jobs (lease expiry above all) through a ZooKeeper outage.
        # A leader cut off from ZooKeeper alone learns its session expired only when it
        # reconnects, and may run its jobs beside a newly elected one until then; each job is
        # safe to run twice at once (guarded updates, unique keys, whole replacements).
        lost = threading.Event()

        def on_state(state: ConnectionState) -> None:
            if state == ConnectionState.LOST:
                lost.set()

        def watch_end() -> None:
            ended.wait()
            lost.set()

        self._listeners.append(on_state)
        threading.Thread(target=watch_end, daemon=True).start()
        try:
            lead(lost)
        finally:
            self._listeners.remove(on_state)

    def leader(self) -> Optional[str]:
        """The identifier of the current leader, or None."""
        try:
            contenders = self._zk.Election(self._path).contenders()
        except (NoNodeError, KazooException):
            return None
        return contenders[0] if contenders else None
