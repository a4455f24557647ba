"""What a running message shares with its worker: whether its cancel was requested, and the
progress its handler reports.

The lease keeper learns of a cancel request from a heartbeat's reply and calls
:meth:`RunControl.request_cancel`; the handler sees it as ``message.cancelled``, as the
:class:`~tidemq.errors.MessageCancelledError` of ``message.checkpoint()``, or (an ``async def``
handler) as the cancellation of its task. ``message.progress(...)`` hands the report to the
keeper, which sends the latest one with a heartbeat at most about once a second.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .errors import MessageCancelledError

__all__ = ["RunControl"]


class RunControl:
    """The cancel flag and the progress sink of one handler run."""

    __slots__ = ("message_id", "_cancelled", "_on_cancel", "_lock", "_progress")

    def __init__(self, message_id: int,
                 progress: Optional[Callable[[float, Optional[float], str], None]] = None) -> None:
        self.message_id = message_id
        # A flag, not a threading.Event: nothing waits on it, and an Event (a Condition and its
        # lock) made for every run was a twentieth of a worker's Python per message.
        self._cancelled = False
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._progress = progress

    @property
    def cancelled(self) -> bool:
        """True once the message's cancel was requested."""
        return self._cancelled

    def request_cancel(self) -> None:
        """The message's cancel was requested: set the flag and run the cancel callbacks once."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the cancel is requested (at once if it already was)."""
        with self._lock:
            if not self._cancelled:
                self._on_cancel.append(callback)
                return
        callback()

    def checkpoint(self) -> None:
        """Raise MessageCancelledError once the cancel was requested."""
        if self._cancelled:
            raise MessageCancelledError(f"message {self.message_id} was cancelled while it ran")

    def report(self, done: float, total: Optional[float], note: str) -> None:
        """Hand a progress report to the worker (dropped when nothing sends it: a broadcast)."""
        if self._progress is not None:
            self._progress(done, total, note)
