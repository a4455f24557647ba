"""Deliveries leased ahead of their effect_time, handed on when the wall clock reaches it."""

from __future__ import annotations

import heapq
import threading
import time
from typing import Callable, Optional

from .link import Delivery

__all__ = ["DueTimer"]


class DueTimer:
    """Passes each delivery to ``ready`` at its ``effect_time``, never before; those already due
    go at once, in the caller's thread. One timer thread sleeps until the earliest is due."""

    def __init__(self, ready: Callable[[Delivery], None], name: str = "tidemq-timer") -> None:
        self._ready = ready
        self._heap: list[tuple[float, int, Delivery]] = []  # (effect epoch seconds, id, delivery)
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, deliveries: list[Delivery]) -> None:
        """Hand on what is due now; keep the rest until its time."""
        now = time.time()
        early = []
        for delivery in deliveries:
            due = delivery.effect_time.timestamp()
            if due <= now:
                self._ready(delivery)
            else:
                early.append((due, delivery.id, delivery))
        if early:
            with self._cond:
                for entry in early:
                    heapq.heappush(self._heap, entry)
                self._cond.notify()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Hand on everything still held at its time, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._heap:
                    if self._stopping:
                        return
                    self._cond.wait()
                    continue
                # effect_time is wall-clock time: compare with time.time(), and never hand on
                # early (a wait ends before its timeout only when something new arrived).
                delay = self._heap[0][0] - time.time()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._ready(heapq.heappop(self._heap)[2])
