"""An open-loop producer: batches sent on a schedule, whatever happened to the earlier ones.

A closed-loop producer (send, wait for the answer, send again) slows down with the system it
measures and hides the slowdown. Here a scheduler thread queues one ``produce_many`` batch every
``batch / rate`` seconds; sender threads (each with its own ``Client``, like separate
application processes) take them in order. The rate can change at any moment (the overload
phase). Every call is kept: when it was due, sent and answered, how many messages, and the ids
or the error; a call that falls behind its schedule shows as send lag, not as a lower rate.

``DelayedProducer`` sends single messages due 1-3 s later (the lateness probe), also on a
schedule. Each message's data carries ``t`` (when its call was sent, epoch seconds) and ``k``
(its kind: "n" due now, "d" delayed), which the worker's handler writes into its record.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["Call", "OpenLoopProducer", "DelayedProducer"]


@dataclass
class Call:
    """One produce call: scheduled, sent and answered at (epoch s), size, ids or error."""

    due: float
    size: int
    sent: float = 0.0
    done: float = 0.0
    ids: list[int] = field(default_factory=list)
    error: str = ""

    @property
    def latency(self) -> float:
        return self.done - self.sent


class OpenLoopProducer:
    """``rate`` messages per second of ``topic`` in ``produce_many`` batches of ``batch``."""

    def __init__(self, make_client: Callable[[], Any], topic: str, rate: float, batch: int, senders: int) -> None:
        self.make_client, self.topic, self.batch = make_client, topic, batch
        self.rate = rate
        self.calls: list[Call] = []
        self._queue: "queue.SimpleQueue[Optional[Call]]" = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients = [make_client() for _ in range(senders)]
        self._threads = [threading.Thread(target=self._send, args=(c,), name=f"bench-sender-{k}", daemon=True)
                         for k, c in enumerate(self._clients)]
        self._threads.append(threading.Thread(target=self._schedule, name="bench-schedule", daemon=True))

    def start(self) -> "OpenLoopProducer":
        for t in self._threads:
            t.start()
        return self

    def _schedule(self) -> None:
        due = time.time()
        while not self._stop.is_set():
            wait = due - time.time()
            if wait > 0 and self._stop.wait(wait):
                return
            call = Call(due, self.batch)
            with self._lock:
                self.calls.append(call)
            self._queue.put(call)
            # The next batch is due one batch-time later, counted from this one's due time (not
            # from now): a stalled scheduler catches up, so the offered rate stays the rate.
            due += self.batch / self.rate

    def _send(self, client: Any) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            call.sent = time.time()
            datas = [{"t": round(call.sent, 6), "k": "n"} for _ in range(call.size)]
            try:
                call.ids = list(client.produce_many(self.topic, datas))
            except Exception as exc:  # every failure is a figure: its type names the fault
                call.error = type(exc).__name__
            call.done = time.time()

    def stop(self, timeout: float) -> int:
        """Stop scheduling, let the senders finish what is queued for up to ``timeout`` seconds;
        returns how many calls were never sent (left queued when the time ran out)."""
        if not self._stop.is_set():
            self._stop.set()
            for _ in self._clients:
                self._queue.put(None)
        deadline = time.time() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.time()))
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        with self._lock:
            return sum(1 for c in self.calls if not c.sent)


class DelayedProducer:
    """``rate`` single messages per second, each due ``low``..``high`` seconds after it is sent."""

    def __init__(self, client: Any, topic: str, rate: float, low: float = 1.0, high: float = 3.0) -> None:
        self.client, self.topic, self.rate, self.low, self.high = client, topic, rate, low, high
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._random = random.Random(26)
        self._thread = threading.Thread(target=self._run, name="bench-delayed", daemon=True)

    def start(self) -> "DelayedProducer":
        self._thread.start()
        return self

    def _run(self) -> None:
        due = time.time()
        while not self._stop.is_set():
            wait = due - time.time()
            if wait > 0 and self._stop.wait(wait):
                return
            call = Call(due, 1, sent=time.time())
            try:
                call.ids = [self.client.produce(self.topic, {"t": round(call.sent, 6), "k": "d"},
                                                delay=self._random.uniform(self.low, self.high))]
            except Exception as exc:
                call.error = type(exc).__name__
            call.done = time.time()
            self.calls.append(call)
            due = max(due + 1 / self.rate, time.time() - 1)  # no burst of catch-up after an outage

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout)
        try:
            self.client.close()
        except Exception:
            pass
