"""The policies the lifecycle's transitions follow: when a failed attempt is retried and after
how long, what a handler's run comes to, and who removes a topic's old successes.

:mod:`tidemq.lifecycle` names each of these again: callers import them from there.
"""

from __future__ import annotations

import enum
import random
from typing import Optional, Protocol, Sequence

__all__ = ["Attempted", "Backoff", "HandlerOutcome", "handler_outcome", "next_delay", "retries_left",
           "retention_deletes_success"]


class _Named(str, enum.Enum):
    """A string enum that prints as its value (in f-strings, trace lines and templates)."""

    def __str__(self) -> str:
        return self.value


class Attempted(Protocol):
    """What the retry decision reads of a message (a stored message has all of it)."""

    retry_remaining: int
    retry_schedule: Optional[Sequence[float]]
    attempt: int


class Backoff(Protocol):
    """A topic's exponential backoff (topic settings have both)."""

    retry_base: float
    retry_max: float


def retries_left(retry_remaining: int) -> bool:
    """Whether a failed attempt is retried (:func:`fail_attempt`) rather than ending in FAIL."""
    return retry_remaining > 0


class HandlerOutcome(_Named):
    """What a handler's run comes to, decided once where it ends (the worker) by the rule the
    broker applies to its ack: SUCCESS, RETRY (it raised with retries left: NEW again after the
    next delay) or FAIL (it raised on its last attempt: a dead letter), or CANCELLED (it stopped
    after its message's cancel was requested)."""

    SUCCESS = "success"
    RETRY = "retry"
    FAIL = "fail"
    CANCELLED = "cancelled"  # it stopped (raised, or its task was cancelled) after a cancel request


def handler_outcome(failed: bool, retry_remaining: int) -> HandlerOutcome:
    """The outcome of a run that returned (``failed`` False) or raised, of a message delivered
    with ``retry_remaining`` retries."""
    if not failed:
        return HandlerOutcome.SUCCESS
    return HandlerOutcome.RETRY if retries_left(retry_remaining) else HandlerOutcome.FAIL


def next_delay(msg: Attempted, backoff: Backoff, rng: Optional[random.Random] = None) -> float:
    """Seconds until the next attempt of ``msg``, which still has retries left.

    With a schedule, entry k is the delay before retry k+1. Otherwise the topic's backoff:
    ``retry_base * 2**k`` capped at ``retry_max``, with jitter in [50 %, 100 %] so that a burst
    of failures does not come back as a burst.
    """
    if msg.retry_schedule:
        used = len(msg.retry_schedule) - msg.retry_remaining
        return float(msg.retry_schedule[min(max(used, 0), len(msg.retry_schedule) - 1)])
    used = max(msg.attempt - 1, 0)
    ceiling = min(backoff.retry_base * (2 ** min(used, 40)), backoff.retry_max)
    return ceiling * (rng or _RNG).uniform(0.5, 1.0)


_RNG = random.Random()


def retention_deletes_success(retention_days: int, archive: bool) -> bool:
    """Who removes a topic's SUCCESS rows: the broker's retention job (True) or the archive
    pipeline (False: topics marked ``archive``, or kept with ``retention_days`` 0). Never both,
    so the two never race for a row; FAIL rows are always left to an operator or the archive."""
    return not archive and retention_days > 0
