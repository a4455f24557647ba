"""A stopping consumer's deadline, shared by the threads that talk to brokers on its behalf."""

from __future__ import annotations

import threading
import time
from typing import Optional

__all__ = ["Drain", "LAST_CALL"]

LAST_CALL = 0.2  # seconds a call may take once the drain's deadline has passed


class Drain:
    """Unset while the consumer runs; once :meth:`until` sets a deadline (``time.monotonic()``),
    every call made ends by it and work still waiting for a broker is given up there."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: Optional[float] = None

    def until(self, deadline: float) -> None:
        """The consumer is stopping: wake whoever waits between tries."""
        with self._cond:
            self._deadline = deadline
            self._cond.notify_all()

    @property
    def deadline(self) -> Optional[float]:
        return self._deadline

    def left(self) -> float:
        """Seconds until the deadline (0 when none is set or it passed)."""
        deadline = self._deadline
        return max(deadline - time.monotonic(), 0.0) if deadline is not None else 0.0

    def call_timeout(self) -> Optional[float]:
        """The timeout of a call made now: the link's own (None), or what is left of the drain."""
        deadline = self._deadline
        return None if deadline is None else max(deadline - time.monotonic(), LAST_CALL)

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before trying again, less if the drain ends sooner (a drain that starts
        meanwhile cuts the wait short); return True when the drain's deadline has passed."""
        with self._cond:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return True
            wait = seconds if self._deadline is None else min(seconds, self._deadline - time.monotonic())
            self._cond.wait(max(wait, 0.0))
            return False
