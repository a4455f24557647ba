"""How many messages a QUEUE runner asks for per pull, and holds leased ahead of its handlers.

A consumer declared with ``batch`` pulls that many at a time. One declared without it (what
``@mq_consumer("topic")`` gives) adapts: it holds about :data:`HOLD_AHEAD` seconds of work for
its handler slots, from the average run time of its handler. A no-op or millisecond handler then
pulls hundreds per lock transaction (a pull's round trip, not the handler, was what bounded an
untuned worker), while a handler that runs for seconds holds one message per slot, so a long
message never waits behind many others that this worker leased and cannot start yet.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["Prefetch", "HOLD_AHEAD", "FIRST_WINDOW", "MOST_WINDOW"]

#: Seconds of work an adaptive runner keeps leased ahead of its handlers: long enough that
#: pulls are rare next to runs, short against any ttr (leases held this long are beaten anyway).
HOLD_AHEAD = 0.5
#: The first pull of an adaptive runner, before any run was timed (the fixed default before).
FIRST_WINDOW = 16
#: The largest adaptive pull: the size the benchmark's tuned workers use.
MOST_WINDOW = 500
#: Weight of the newest run time in the moving average: about the last 20 runs count.
_WEIGHT = 0.05
#: Runs shorter than this count as this long: a no-op handler's time is mostly the clock's.
_SHORTEST = 1e-5


class Prefetch:
    """The pull size (``window``) and prefetch bound (``capacity``) of one runner.

    Not thread-safe: the runner calls it under its own lock.
    """

    def __init__(self, slots: int, batch: Optional[int], serial: bool = False) -> None:
        self.slots = 1 if serial else slots
        self.adaptive = batch is None and not serial
        self.window = (1 if serial else batch if batch is not None
                       else max(1, min(MOST_WINDOW, max(FIRST_WINDOW, slots))))
        self._average: Optional[float] = None  # seconds per handler run, a moving average
        self._serial = serial

    @property
    def capacity(self) -> int:
        """Messages leased and not yet acknowledged at most: every slot busy and a window waiting."""
        return 1 if self._serial else self.slots + self.window

    @property
    def min_pull(self) -> int:
        """Pull only when this many fit: topping up the last few free places after every large
        pull meant a lock transaction per handful of messages."""
        return 1 if self._serial else max(1, self.window // 2)

    @property
    def average_run(self) -> Optional[float]:
        """The moving average of handler run times in seconds (None before the first run)."""
        return self._average

    def ran(self, seconds: float) -> None:
        """Record one handler run of ``seconds``; an adaptive window follows the average."""
        if not self.adaptive:
            return
        seconds = max(seconds, _SHORTEST)
        self._average = seconds if self._average is None else self._average + _WEIGHT * (seconds - self._average)
        self.window = max(1, min(MOST_WINDOW, int(self.slots * HOLD_AHEAD / self._average)))
