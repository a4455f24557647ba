"""Time as tidemq stores it: naive UTC datetimes truncated to the millisecond."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

__all__ = ["now", "truncate_ms", "from_epoch_ms", "to_epoch_ms", "after"]

_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)


def truncate_ms(moment: datetime) -> datetime:
    """Drop sub-millisecond digits so the database never rounds a time up or down."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def now() -> datetime:
    """The current UTC time, naive, to the millisecond."""
    # From the epoch's milliseconds: datetime.now(timezone.utc) and the two replace() calls cost
    # five times as much, and every produce, pull and ack asks for the time.
    return _EPOCH + _MS * (time.time_ns() // 1_000_000)


def after(moment: datetime, seconds: float) -> datetime:
    """``moment`` plus ``seconds``, to the millisecond."""
    return truncate_ms(moment + timedelta(seconds=seconds))


def from_epoch_ms(ms: int) -> datetime:
    """A naive UTC datetime from milliseconds since the epoch."""
    return _EPOCH + timedelta(milliseconds=ms)


def to_epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch of a naive UTC datetime."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)
