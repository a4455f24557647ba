"""Handles for asyncio: :class:`AsyncHandle` is :class:`tidemq.handles.Handle` as coroutines,
and awaiting the handle itself waits for its result.

>>> h = await tidemq.aio.produce("report.build", {"month": "2026-10"}, result=True)   # doctest: +SKIP
>>> value = await h                                                                  # doctest: +SKIP
>>> value = await tidemq.aio.handle(h.id).result(timeout=30)                         # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any, Generator, Optional, Protocol, Sequence

from ..errors import ResultTimeoutError
from ..handles import outcome
from ..lifecycle import MessageStatus
from ..limits import MAX_WAIT
from ..results import MessageState, Progress

__all__ = ["AsyncHandle"]


class AsyncResultSource(Protocol):
    """What an async handle calls (an :class:`~tidemq.aio.AsyncClient`)."""

    async def results(self, ids: Sequence[int], wait: float = 0.0,
                      timeout: Optional[float] = None) -> list[MessageState]:
        ...

    async def cancel_many(self, ids: Sequence[int], timeout: Optional[float] = None, *,
                          running: bool = False) -> list[bool]:
        ...


class AsyncHandle:
    """One message, by id, and the async client that reads it; ``await handle`` is
    ``await handle.result()``."""

    __slots__ = ("id", "_source")

    def __init__(self, id: int, source: AsyncResultSource) -> None:
        self.id = int(id)
        self._source = source

    def __repr__(self) -> str:
        return f"AsyncHandle({self.id})"

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    async def state(self) -> MessageState:
        """Everything a broker knows of the message now."""
        return (await self._source.results([self.id]))[0]

    async def status(self) -> MessageStatus:
        """NEW, RUNNING, SUCCESS, FAIL or CANCELLED; MessageNotFoundError for an unknown id."""
        state = await self.state()
        if not state.found or state.status is None:
            outcome(state)
        assert state.status is not None
        return state.status

    async def progress(self) -> Optional[Progress]:
        """The handler's latest progress report, or None."""
        return (await self.state()).progress

    async def result(self, timeout: Optional[float] = None) -> Any:
        """As :meth:`tidemq.handles.Handle.result`, without blocking the event loop."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            left = MAX_WAIT if deadline is None else max(deadline - time.monotonic(), 0.0)
            [state] = await self._source.results([self.id], wait=min(left, MAX_WAIT))
            if state.final:
                return outcome(state)
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeoutError(f"message {self.id} is still {state.status} after {timeout} s")

    async def cancel(self, running: bool = True) -> bool:
        """As :meth:`tidemq.handles.Handle.cancel`."""
        return (await self._source.cancel_many([self.id], running=running))[0]
