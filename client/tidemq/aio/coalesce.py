"""Coalescing for coroutines: concurrent ``await produce()`` calls share Produce RPCs.

The same rule as :mod:`tidemq.coalesce` (at most ``slots`` flushes running; requests that find
them busy queue and go together in the next flush; no timer), on one event loop, where the
flushes run as tasks instead of in the callers' threads.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Awaitable, Callable, Generic, Optional, TypeVar

from ..coalesce import Request

__all__ = ["AsyncCoalescer"]

P = TypeVar("P")
R = TypeVar("R")


class AsyncCoalescer(Generic[P, R]):
    """Runs ``await flush(requests)`` for batches of concurrent requests, ``slots`` at a time.

    ``flush`` must set ``result`` or ``error`` on every request it is given; ``timeout_error``
    builds the exception for a request still queued at its deadline.
    """

    def __init__(self, flush: Callable[[list[Request[P, R]]], Awaitable[None]], slots: int, max_items: int,
                 max_bytes: int, timeout_error: Callable[[float], BaseException]) -> None:
        if slots < 1:
            raise ValueError(f"slots must be 1 or more, got {slots}")
        self._flush = flush
        self._slots = slots
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._timeout_error = timeout_error
        self._pending: collections.deque[tuple[Request[P, R], asyncio.Future[None]]] = collections.deque()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones
        #: Flushes made and requests they carried (benchmarks and tests read them).
        self.flushes = 0
        self.requests = 0

    async def submit(self, payload: P, items: int = 1, size: int = 0, timeout: Optional[float] = None) -> R:
        """Flush ``payload`` (with others queued at the same time) and return its result.

        ``timeout`` bounds the wait for a free slot; once sent, the flush's own deadline applies.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        # No Condition: a future per request is how a coroutine waits.
        request: Request[P, R] = Request(payload, items, size, deadline)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (request, done)
        self._pending.append(entry)
        self._kick()
        # A timer, not asyncio.wait_for: wait_for's extra future and callbacks per call were a
        # measurable share of a produce's CPU, and most requests are sent at once anyway.
        expiry = None
        if timeout is not None and not request.sent:
            expiry = asyncio.get_running_loop().call_later(timeout, self._expire, entry, timeout)
        try:
            await done
        except asyncio.CancelledError:
            if not request.sent and entry in self._pending:
                self._pending.remove(entry)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        if request.error is not None:
            raise request.error
        return request.result  # type: ignore[return-value]

    def _expire(self, entry: tuple[Request[P, R], "asyncio.Future[None]"], timeout: float) -> None:
        """A request still queued at its deadline is withdrawn unsent; one on its way is left to
        its flush, whose RPC has a deadline of its own."""
        request, done = entry
        if not request.sent and entry in self._pending:
            self._pending.remove(entry)
            done.set_exception(self._timeout_error(timeout))

    def _kick(self) -> None:
        """Start flushes while slots are free and requests are queued."""
        while self._pending and self._running < self._slots:
            if self._pending[0][1].done():  # its caller was cancelled (or expired): never send it
                self._pending.popleft()
                continue
            batch = [self._pending.popleft()]
            items, size = batch[0][0].items, batch[0][0].size
            while self._pending:
                head = self._pending[0][0]
                if self._pending[0][1].done():
                    self._pending.popleft()
                    continue
                if items + head.items > self._max_items or size + head.size > self._max_bytes:
                    break
                batch.append(self._pending.popleft())
                items, size = items + head.items, size + head.size
            for request, _ in batch:
                request.sent = True
            self._running += 1
            self.flushes += 1
            self.requests += len(batch)
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[Request[P, R], "asyncio.Future[None]"]]) -> None:
        requests = [request for request, _ in batch]
        try:
            await self._flush(requests)
        except BaseException as exc:  # a bug in flush must reach every caller, not strand them
            for request in requests:
                if request.error is None and request.result is None:
                    request.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._running -= 1
            for request, done in batch:
                request.done = True
                if not done.done():
                    done.set_result(None)
            self._kick()
