"""Coalescing: concurrent callers share one expensive call (an RPC, a transaction).

A ``Coalescer`` keeps at most ``slots`` flushes running. A caller that finds them all busy queues
its request; the next caller to find a free slot takes every queued request (within the item and
byte limits) and flushes them together, in its own thread. Nothing waits on a timer: an idle
coalescer flushes a lone request at once, so its latency is unchanged; a busy one makes larger
flushes. There is no hand-off to another thread either: one of the callers does the work.

Two users:

- the client's ``produce()`` (``Client``): a gRPC call costs far more CPU than a message, so
  sixty-four threads each sending their own Produce RPC are bound by the RPC layer; coalesced,
  they send a few RPCs that carry many messages each;
- the broker's group commit (``tidemq_broker.writer``): the Produce RPCs a broker receives at the
  same time are inserted in one transaction and committed once.

The flush function decides what a shared failure means for each request (see its users); the
coalescer guarantees that each caller gets its own result or error, and that a request still
queued at its caller's deadline is withdrawn unsent.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

__all__ = ["Coalescer", "Request"]

_NO_BOUND = 365 * 24 * 3600.0
P = TypeVar("P")
R = TypeVar("R")


class Request(Generic[P, R]):
    """One caller's payload and, once flushed, its result or error (set by the flush function)."""

    __slots__ = ("payload", "items", "size", "deadline", "sent", "done", "result", "error", "wake", "signalled")

    def __init__(self, payload: P, items: int, size: int, deadline: Optional[float]) -> None:
        # This caller's own wake-up: a lock held until it is signalled (``_signal``). Not a
        # Condition of the coalescer's lock: the callers of a flush would all wake to take that
        # one lock again, one after the other, only to see that they are done.
        self.wake = threading.Lock()
        self.wake.acquire()
        self.signalled = False  # wake released and not yet taken back (coalescer's lock held)
        self.payload = payload
        self.items = items
        self.size = size
        self.deadline = deadline
        self.sent = False
        self.done = False
        self.result: Optional[R] = None
        self.error: Optional[BaseException] = None


def _signal(request: Request) -> None:
    """Wake ``request``'s caller (at most one pending wake-up); the coalescer's lock is held."""
    if not request.signalled:
        request.signalled = True
        request.wake.release()


class Coalescer(Generic[P, R]):
    """Runs ``flush(requests)`` for batches of concurrent requests, in the callers' threads.

    ``flush`` must set ``result`` or ``error`` on every request it is given. ``timeout_error``
    builds the exception for a request still queued at its deadline.
    """

    def __init__(self, flush: Callable[[list[Request[P, R]]], None], slots: int, max_items: int, max_bytes: int,
                 timeout_error: Callable[[float], BaseException]) -> None:
        if slots < 1:
            raise ValueError(f"slots must be 1 or more, got {slots}")
        self._flush = flush
        self._slots = slots
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._timeout_error = timeout_error
        self._lock = threading.Lock()
        self._pending: collections.deque[Request[P, R]] = collections.deque()
        self._running = 0
        self._closed: Optional[Callable[[], BaseException]] = None
        #: Flushes made and requests they carried (benchmarks and tests read them).
        self.flushes = 0
        self.requests = 0

    def submit(self, payload: P, items: int = 1, size: int = 0, timeout: Optional[float] = None) -> R:
        """Flush ``payload`` (with others queued at the same time) and return its result.

        ``timeout`` bounds the wait for a free slot (None, or more than a year: no bound).
        """
        unbounded = timeout is None or timeout > _NO_BOUND  # a huge wait would overflow the lock
        request: Request[P, R] = Request(payload, items, size,
                                         None if unbounded else time.monotonic() + timeout)  # type: ignore[operator]
        lock = self._lock
        lock.acquire()
        held = True
        try:
            if self._closed is not None:
                raise self._closed()
            self._pending.append(request)
            while not request.done:
                if not request.sent and self._running < self._slots:
                    self._flush_pending()
                    continue
                remaining = None if request.deadline is None else request.deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    if not request.sent:
                        self._pending.remove(request)
                        raise self._timeout_error(timeout or 0.0)
                    remaining = None  # sent: its flush has a deadline of its own
                # Only this caller's own flush ending, or a slot coming free while this request
                # heads the queue, wakes it: no herd of waiters re-checking every flush.
                lock.release()
                held = False
                woken = request.wake.acquire(True, -1 if remaining is None else remaining)
                if woken and request.done:
                    break  # its flush is over: nothing shared is left to look at
                lock.acquire()
                held = True
                if request.signalled:
                    if not woken:
                        request.wake.acquire()  # signalled as the wait timed out: released, take it
                    request.signalled = False
        finally:
            if held:
                lock.release()
        if request.error is not None:
            raise request.error
        return request.result  # type: ignore[return-value]

    def close(self, error: Callable[[], BaseException]) -> None:
        """Refuse new requests with ``error()``; requests already queued are still flushed."""
        with self._lock:
            self._closed = error

    def _flush_pending(self) -> None:
        """Take queued requests (oldest first, within the limits) and flush them; lock held on entry."""
        batch = [self._pending.popleft()]
        items, size = batch[0].items, batch[0].size
        while self._pending:
            head = self._pending[0]
            if items + head.items > self._max_items or size + head.size > self._max_bytes:
                break
            batch.append(self._pending.popleft())
            items, size = items + head.items, size + head.size
        for request in batch:
            request.sent = True
        self._running += 1
        if self._pending and self._running < self._slots:
            _signal(self._pending[0])  # what did not fit may take the other free slot
        self.flushes += 1
        self.requests += len(batch)
        self._lock.release()
        try:
            self._flush(batch)
        except BaseException as exc:  # a bug in flush must reach every caller, not strand them
            for request in batch:
                if request.error is None and request.result is None:
                    request.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._lock.acquire()
            self._running -= 1
            for request in batch:
                request.done = True
                _signal(request)
            if self._pending:
                _signal(self._pending[0])  # the oldest queued request takes the free slot
