"""Time as tidemq stores it: naive UTC datetimes truncated to the millisecond."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

__all__ = ["now", "truncate_ms", "from_epoch_ms", "to_epoch_ms", "after"]

_EPOCH = datetime(1970, 1, 1)


def truncate_ms(moment: datetime) -> datetime:
    """Drop sub-millisecond digits so the database never rounds a time up or down."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def now() -> datetime:
    """The current UTC time, naive, to the millisecond."""
    return truncate_ms(datetime.now(timezone.utc).replace(tzinfo=None))


def after(moment: datetime, seconds: float) -> datetime:
    """``moment`` plus ``seconds``, to the millisecond."""
    return truncate_ms(moment + timedelta(seconds=seconds))


def from_epoch_ms(ms: int) -> datetime:
    """A naive UTC datetime from milliseconds since the epoch."""
    return _EPOCH + timedelta(milliseconds=ms)


def to_epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch of a naive UTC datetime."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)
