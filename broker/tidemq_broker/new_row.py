"""A new message's row: one builder for the messages of a Produce call (``intake``) and for
``tidemq.enqueue``, so both decide the effect time (:func:`due_at`) and the topic's retry
default (:func:`new_row`) alike.

The callers check their own input forms first (a wire request, Python arguments); what they
hand over here is checked already, except the distance of an absolute effect time, which is
only known once it is compared with the clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional, Sequence

from tidemq import clock
from tidemq.validation import MAX_DELAY_SECONDS

from .errors import InvalidDelayError
from .storage import NewRow, TopicSettings

__all__ = ["new_row", "due_at"]


def new_row(topic: str, data: str, settings: TopicSettings, due: datetime, *, retry: int = -1,
            retry_schedule: Optional[Sequence[float]] = None, unique_key: Optional[str] = None,
            trace_context: Optional[str] = None, priority: int = 0, flow_key: Optional[str] = None) -> NewRow:
    """The row of a message of ``topic`` due at ``due`` (see :func:`due_at`).

    ``retry`` -1 takes the topic's default count (``settings.retry_count``); a
    ``retry_schedule`` sets the count to its length.
    """
    if retry_schedule is not None:
        retry = len(retry_schedule)
    elif retry < 0:
        retry = settings.retry_count
    return NewRow(topic=topic, data=data, effect_time=due, retry_remaining=retry,
                  retry_schedule=list(retry_schedule) if retry_schedule is not None else None,
                  unique_key=unique_key or None, trace_context=trace_context or None, priority=priority,
                  flow_key=flow_key or None)


def due_at(now: datetime, delay: Optional[float] = None, at_ms: Optional[int] = None) -> datetime:
    """When a message produced ``now`` is due: ``delay`` seconds later, at ``at_ms`` (milliseconds
    since the epoch; 0 or less means now), or now. ``at_ms`` more than 10 years ahead is refused."""
    if delay is not None:
        return clock.after(now, delay)
    if at_ms is not None:
        # Compared in milliseconds first: a datetime cannot hold 2^62 ms, and the caller gets
        # the limit named instead of an overflow.
        if at_ms - clock.to_epoch_ms(now) > MAX_DELAY_SECONDS * 1000:
            raise InvalidDelayError(f"effect_time is more than {MAX_DELAY_SECONDS} s (10 years) ahead (the limit)")
        return clock.from_epoch_ms(at_ms) if at_ms > 0 else now
    return now
