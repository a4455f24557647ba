"""A thread that sends signals of topics through the coordinator, so the calls that raise them
do not wait for ZooKeeper.

Topics given while a round of signals is on its way go together in the next round: a signal
says that something changed in a topic, not how often. A failure is logged once per outage (a
lost signal only delays what the database still holds: the watchers find it by their own
periodic reads), and so is its end.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from tidemq.errors import CoordinationError

__all__ = ["SignalSender"]


class SignalSender:
    """Calls ``signal(topic)`` from a thread of its own for every topic given to :meth:`send`.

    ``failing`` and ``working`` are the lines ``log`` says when sending starts and stops failing
    (``failing`` gets the error as its one ``%s``).
    """

    def __init__(self, signal: Callable[[str], None], name: str, log: logging.Logger,
                 failing: str, working: str) -> None:
        self._signal = signal
        self._log = log
        self._failing_text = failing
        self._working_text = working
        self._lock = threading.Lock()
        self._pending_changed = threading.Condition(self._lock)
        self._pending: set[str] = set()
        self._stopped = False
        self._failing = False
        self._thread = threading.Thread(target=self._send_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._pending_changed.notify_all()

    def send(self, topics: Iterable[str]) -> None:
        """Signal ``topics`` soon."""
        with self._lock:
            before = len(self._pending)
            self._pending.update(topics)
            if len(self._pending) > before:
                self._pending_changed.notify()

    def _send_forever(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._stopped:
                    self._pending_changed.wait()
                if self._stopped:
                    return
                topics, self._pending = sorted(self._pending), set()
            for topic in topics:
                self._send(topic)

    def _send(self, topic: str) -> None:
        try:
            self._signal(topic)
        except CoordinationError as exc:
            if not self._failing:
                self._log.warning(self._failing_text, exc)
            self._failing = True
            return
        if self._failing:
            self._log.info(self._working_text)
            self._failing = False
