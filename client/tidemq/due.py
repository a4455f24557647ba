"""Deliveries leased ahead of their effect_time, handed on when the wall clock reaches it, and
the handler threads' queue, where those go ahead of everything prefetched meanwhile."""

from __future__ import annotations

import collections
import heapq
import queue
import threading
import time
from typing import Callable, Optional

from .link import Delivery

__all__ = ["DueTimer", "WorkQueue"]


class DueTimer:
    """Passes each delivery to ``ready`` if it is already due (at once, in the caller's thread),
    else to ``on_time`` at its ``effect_time``, never before. One timer thread sleeps until the
    earliest is due."""

    def __init__(self, ready: Callable[[Delivery], None], on_time: Optional[Callable[[Delivery], None]] = None,
                 name: str = "tidemq-timer") -> None:
        self._ready = ready
        self._on_time = on_time or ready
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
                self._on_time(heapq.heappop(self._heap)[2])


_WAKE = object()  # put in the queue beside a delivery on the front lane: wakes a waiting thread


class WorkQueue:
    """The deliveries a runner's handler threads take, first in first out, with a front lane.

    A delivery leased ahead of its effect_time goes on the front lane when its time comes
    (:meth:`put_on_time`): the next handler thread to come free takes it before every message
    queued behind the pulls meanwhile. Behind a few hundred prefetched messages it would start
    tens of milliseconds late, and a delayed message's promise is its time. ``None`` tells one
    thread to stop (after whatever is ahead of it).
    """

    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._front: "collections.deque[Delivery]" = collections.deque()

    def put(self, delivery: Optional[Delivery]) -> None:
        """Queue ``delivery`` behind the others (``None``: one thread stops when it gets there)."""
        self._queue.put(delivery)

    def put_on_time(self, delivery: Delivery) -> None:
        """Queue ``delivery`` ahead of everything on the common lane."""
        self._front.append(delivery)
        self._queue.put(_WAKE)  # a thread blocked in get() takes it; a busy one finds it first

    def get(self) -> Optional[Delivery]:
        """The next delivery (front lane first), waiting for one; ``None``: stop."""
        while True:
            try:
                return self._front.popleft()
            except IndexError:
                pass
            item = self._queue.get()
            if item is not _WAKE:
                return item  # type: ignore[return-value]
