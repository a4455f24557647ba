"""A call run in a thread of its own, for tests that hold one call while others queue behind it."""

from __future__ import annotations

import threading
from typing import Any, Callable


class InThread(threading.Thread):
    """Runs ``fn(*args)`` at once in a daemon thread and keeps its result or its exception."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__(daemon=True, name=f"test-{getattr(fn, '__name__', 'call')}")
        self.fn, self.args = fn, args
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # kept for the test to look at
            self.error = exc

    def outcome(self, timeout: float = 10.0) -> Any:
        """The exception if the call raised one, else its result (after it ended)."""
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not end within {timeout} s"
        return self.error or self.result

    def value(self, timeout: float = 10.0) -> Any:
        """The call's result, raising its exception if it raised one."""
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not end within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result
