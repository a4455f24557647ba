"""Cancel requests: pending messages removed, running ones marked, and the workers running them
told at once.

A running message's cancel is a flag on its row (``cancel_requested``), which its worker reads
with its next heartbeat. Heartbeats come every ttr/3, so a handler that reports no progress
would learn of it up to a third of its ttr later. The broker that records the flag therefore
signals the topics of the marked messages through the coordinator (``Coordinator.signal_cancel``,
from a thread of its own: ``topic_signals``); every worker consuming such a topic beats the
leases it holds at once and so learns of it within tens of milliseconds, whichever broker it
pulls from. The flag stays the truth: a lost signal (ZooKeeper away) only leaves the cancel to
the next heartbeat.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Callable, Optional, Sequence

from tidemq import clock
from tidemq.coordinator import Coordinator

from .results import ResultHub
from .storage import Storage
from .topic_signals import SignalSender

__all__ = ["Cancels", "cancel_signals"]

log = logging.getLogger(__name__)


def cancel_signals(coordinator: Coordinator) -> SignalSender:
    """The sender of a broker's cancel signals (started and stopped by its server)."""
    return SignalSender(coordinator.signal_cancel, "tidemq-cancel-signals", log,
                        "cannot signal cancels of running messages to the workers (%s); they learn of "
                        "them at their next heartbeat until this works again",
                        "signalling cancels of running messages to the workers works again")


class Cancels:
    """Cancels of messages and of workflows, as a broker records them.

    ``wake_released(released, since)`` wakes what waited for the cancelled messages to end;
    ``signals`` (None: none) tells the workers of the marked messages' topics.
    """

    def __init__(self, storage: Storage, results: ResultHub,
                 wake_released: Callable[[dict[str, dict[int, int]], datetime], None], name: str,
                 signals: Optional[SignalSender] = None) -> None:
        self._storage = storage
        self._results = results
        self._wake_released = wake_released
        self._name = name
        self._signals = signals

    def messages(self, ids: Sequence[int], running: bool) -> list[bool]:
        """Delete the messages among ``ids`` not run yet; with ``running``, mark the RUNNING ones in
        the same transaction. Per id, whether it was cancelled or marked."""
        released: dict[str, dict[int, int]] = {}
        topics: set[str] = set()
        before = clock.now()
        cancelled = self._storage.messages.cancel(ids, released, before if running else None, topics,
                                                  broker=self._name)
        self._wake_released(released, before)  # steps that waited for the cancelled ones to end, whatever the outcome
        # Their waiters read them again: a deleted one is gone, a marked one runs until its worker stops it.
        self._results.notify(id for id, gone in zip(ids, cancelled) if gone)
        self._signal(topics)
        return cancelled

    def workflows(self, ids: Sequence[int], running: bool) -> int:
        """Cancel each workflow of ``ids`` whole (``WorkflowStore.cancel_workflows``); how many
        messages were removed or marked."""
        topics: set[str] = set()
        released: dict[str, dict[int, int]] = {}
        before = clock.now()
        counts = self._storage.dependencies.cancel_workflows(ids, running, before, topics, released,
                                                             broker=self._name)
        self._wake_released(released, before)  # what waited on the removed steps from other workflows
        self._signal(topics)
        return sum(done.removed + done.marked for done in counts)

    def _signal(self, topics: set[str]) -> None:
        """Signal the ``topics`` of marked messages (read with the marks, sent after their commit)."""
        if self._signals is not None and topics:
            self._signals.send(topics)
