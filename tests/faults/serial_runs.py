"""In-process handlers of a SERIAL_QUEUE topic that record each run and count the times two ran
at once, for the tests that check a serial topic's exclusivity and order through a fault."""

from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, NamedTuple

from tidemq import Message

__all__ = ["Run", "SerialRuns"]


class Run(NamedTuple):
    id: int
    start: float  # time.monotonic()
    end: float
    worker: Hashable


class SerialRuns:
    """``handler(worker)`` for each worker; ``runs`` in the order they ended."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep
        self.runs: list[Run] = []
        self.overlaps = 0
        self._running = 0
        self._lock = threading.Lock()

    def handler(self, worker: Hashable) -> Callable[[Message], None]:
        def handle(message: Message) -> None:
            with self._lock:
                self._running += 1
                self.overlaps += self._running > 1
            start = time.monotonic()
            time.sleep(self.sleep)
            with self._lock:
                self._running -= 1
                self.runs.append(Run(message.id, start, time.monotonic(), worker))
        return handle

    def assert_one_at_a_time_in_order(self, ids: list[int]) -> None:
        """No two runs overlapped, and the runs, by start, were ``ids`` (each once)."""
        assert self.overlaps == 0, f"{self.overlaps} times two serial handlers ran at once"
        ordered = sorted(self.runs, key=lambda run: run.start)
        assert all(a.end <= b.start for a, b in zip(ordered, ordered[1:])), "handler runs overlap"
        assert [run.id for run in ordered] == ids, "serial messages ran out of (effect_time, id) order, or one twice"
