"""A handle on one produced message: its status, its progress, its result, and cancelling it.

>>> h = tidemq.produce("report.build", {"month": "2026-10"}, result=True)
>>> h.status(), h.progress()                                   # doctest: +SKIP
>>> value = h.result(timeout=30)                               # doctest: +SKIP
>>> tidemq.handle(h.id).cancel(running=True)                   # doctest: +SKIP

Waiting is the broker's long-poll (the Results call), woken by the commit that ends the
message; a handle polls nothing itself. A handle holds only the id and the client it calls, so
:func:`tidemq.handle` rebuilds one anywhere.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional, Protocol, Sequence

from .errors import MessageCancelledError, MessageNotFoundError, ResultTimeoutError
from .lifecycle import MessageStatus
from .limits import MAX_WAIT
from .results import MessageState, Progress, remote_error

__all__ = ["Handle", "ResultSource", "outcome"]


class ResultSource(Protocol):
    """What a handle calls: a :class:`tidemq.Client` or a :class:`tidemq.stub.StubBroker`."""

    def results(self, ids: Sequence[int], wait: float = 0.0, timeout: Optional[float] = None) -> list[MessageState]:
        ...

    def cancel_many(self, ids: Sequence[int], timeout: Optional[float] = None, *,
                    running: bool = False) -> list[bool]:
        ...


def outcome(state: MessageState) -> Any:
    """The value of a final message: its result decoded (SUCCESS), else the typed error raised
    (:class:`~tidemq.errors.RemoteError` for FAIL, MessageCancelledError, MessageNotFoundError)."""
    if not state.found:
        raise MessageNotFoundError(f"message {state.id} is not stored: never produced, cancelled before it "
                                   "ran, or removed by retention")
    if state.status is MessageStatus.FAIL:
        raise remote_error(state.result)
    if state.status is MessageStatus.CANCELLED:
        raise MessageCancelledError(f"message {state.id} was cancelled while it ran")
    return json.loads(state.result) if state.result is not None else None


class Handle:
    """One message, by id, and the client that reads it."""

    __slots__ = ("id", "_source")

    def __init__(self, id: int, source: ResultSource) -> None:
        self.id = int(id)
        self._source = source

    def __repr__(self) -> str:
        return f"Handle({self.id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def state(self) -> MessageState:
        """Everything a broker knows of the message now."""
        return self._source.results([self.id])[0]

    def status(self) -> MessageStatus:
        """NEW, RUNNING, SUCCESS, FAIL or CANCELLED; MessageNotFoundError for an unknown id."""
        state = self.state()
        if not state.found or state.status is None:
            outcome(state)  # raises MessageNotFoundError
        assert state.status is not None
        return state.status

    def progress(self) -> Optional[Progress]:
        """The handler's latest progress report, or None."""
        return self.state().progress

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait for the message to finish (``timeout`` seconds; None: as long as it takes) and
        return its handler's return value. A FAIL raises RemoteError (the handler's exception:
        ``.type``, ``.message``, ``.traceback``), CANCELLED MessageCancelledError, an unknown id
        MessageNotFoundError, and running out of time ResultTimeoutError."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            left = MAX_WAIT if deadline is None else max(deadline - time.monotonic(), 0.0)
            [state] = self._source.results([self.id], wait=min(left, MAX_WAIT))
            if state.final:
                return outcome(state)
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeoutError(f"message {self.id} is still {state.status} after {timeout} s")

    def cancel(self, running: bool = True) -> bool:
        """Cancel the message: a NEW one is deleted; a RUNNING one (``running``) is marked, its
        handler stops and it ends CANCELLED. False when it is already finished or gone."""
        return self._source.cancel_many([self.id], running=running)[0]
