"""Where ``async def`` handlers run: one asyncio event loop on its own thread per worker.

A worker's consumers keep their fetch, ack and heartbeat threads; only the handlers of async
consumers move to the loop, as tasks, each consumer's bounded by its ``concurrency``
(:class:`AsyncHandlers`). A handler that blocks (``time.sleep``, a synchronous client) blocks
every async handler of the worker: such code belongs in a threaded (``def``) handler.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
from typing import Any, Awaitable, Callable, Coroutine, Optional, TypeVar

from .link import Delivery

__all__ = ["EventLoopThread", "AsyncHandlers"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class EventLoopThread:
    """An event loop running on a daemon thread until :meth:`stop`."""

    def __init__(self, name: str = "tidemq-loop") -> None:
        self._name = name
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "EventLoopThread":
        if self._thread is not None:
            return self
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            ready.set()
            try:
                self.loop.run_forever()
            finally:
                self.loop.close()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop (from any thread)."""
        assert self.loop is not None, "start() the loop first"
        self.loop.call_soon_threadsafe(fn, *args)

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        """Run ``coro`` on the loop (from any other thread); its future gives the outcome."""
        assert self.loop is not None, "start() the loop first"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop the loop (tasks still pending are abandoned) and join its thread."""
        if self._thread is None or self.loop is None:
            return
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self._thread = None


class AsyncHandlers:
    """Runs ``run(delivery)`` as a task on ``loop`` for each delivery put, at most
    ``concurrency`` at once; the rest wait in arrival order, except those put ``on_time`` (a
    delayed message whose time came), which start before every other waiting one."""

    def __init__(self, loop: EventLoopThread, run: Callable[[Delivery], Awaitable[None]], concurrency: int) -> None:
        self._loop = loop
        self._run = run
        self._concurrency = concurrency
        # Both touched on the loop's thread only.
        self._waiting: "collections.deque[Delivery]" = collections.deque()
        self._tasks: dict["asyncio.Task[None]", Delivery] = {}
        #: Handlers running now and the most that ever ran at once (tests and metrics read them).
        self.running = 0
        self.peak = 0

    def put(self, delivery: Delivery, on_time: bool = False) -> None:
        """Start handling ``delivery`` when a place is free (thread-safe: the fetch and timer
        threads call it); ``on_time``: ahead of every delivery still waiting."""
        self._loop.call_soon(self._arrive, delivery, on_time)

    def _arrive(self, delivery: Delivery, on_time: bool) -> None:
        if len(self._tasks) < self._concurrency:
            self._start(delivery)
        elif on_time:
            self._waiting.appendleft(delivery)
        else:
            self._waiting.append(delivery)

    def _start(self, delivery: Delivery) -> None:
        task = asyncio.get_running_loop().create_task(self._guarded(delivery))
        self._tasks[task] = delivery
        task.add_done_callback(self._ended)

    def _ended(self, task: "asyncio.Task[None]") -> None:
        self._tasks.pop(task, None)
        if self._waiting and len(self._tasks) < self._concurrency:
            self._start(self._waiting.popleft())

    async def _guarded(self, delivery: Delivery) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self._run(delivery)
        except Exception:  # a bug of ours must not end the task silently
            log.exception("handling message %d of %s failed", delivery.id, delivery.topic)
        finally:
            self.running -= 1

    def cancel(self, timeout: float) -> list[Delivery]:
        """Cancel every handler still running or waiting (a drain that ran out of time) and
        return their deliveries, once the cancelled tasks have ended or ``timeout`` passed."""

        async def cancel_all() -> list[Delivery]:
            waiting = list(self._waiting)  # never started: given back as they are
            self._waiting.clear()
            pending = dict(self._tasks)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(list(pending), timeout=timeout)
            return list(pending.values()) + waiting

        if self._loop.loop is None or self._loop.loop.is_closed():
            return []
        try:
            return self._loop.submit(cancel_all()).result(timeout + 1)
        except concurrent.futures.TimeoutError:
            return []
