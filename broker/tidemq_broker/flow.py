"""A topic's flow limits: checked as operators give them (CLI, console), and the rules every
storage's lock applies (the rate's token bucket, the choice within a per-key limit).

The lock enforces them (``storages/flow.py``, ``storages/memory/leases.py``); see
docs/ARCHITECTURE.md, "Flow control".
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Optional, Sequence, Union

from tidemq.errors import ValidationError, quote

from .storage import FlowLimits

__all__ = ["MAX_RUNNING_LIMIT", "MAX_RATE", "check_limits", "parse_limit", "BURST_SECONDS", "CATCH_UP_SECONDS",
           "KEY_WINDOW", "FIRST_DEPTH", "refill", "within_key_limit"]

MAX_RUNNING_LIMIT = 1_000_000
MAX_RATE = 1_000_000.0  # messages per second


def check_limits(max_running: Optional[int], rate_per_second: Optional[float],
                 max_running_per_key: Optional[int]) -> FlowLimits:
    """The limits, or a ValidationError naming the one out of range (None: no such limit)."""
    for name, value in (("max_running", max_running), ("max_running_per_key", max_running_per_key)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_RUNNING_LIMIT):
            raise ValidationError(f"{name} must be a whole number from 1 to {MAX_RUNNING_LIMIT} "
                                  f"(or none for no limit), got {quote(value)}")
    if rate_per_second is not None and (isinstance(rate_per_second, bool)
                                        or not isinstance(rate_per_second, (int, float))
                                        or not math.isfinite(rate_per_second)
                                        or not 0 < rate_per_second <= MAX_RATE):
        raise ValidationError(f"rate_per_second must be above 0 and at most {MAX_RATE:.0f} messages per second "
                              f"(or none for no limit), got {quote(rate_per_second)}")
    return FlowLimits(max_running, float(rate_per_second) if rate_per_second is not None else None,
                      max_running_per_key)


def parse_limit(text: str, kind: type = int) -> Union[int, float, None]:
    """An operator's limit as typed: a number, or ``none`` / an empty field for no limit."""
    text = text.strip()
    if text.lower() in ("", "none"):
        return None
    try:
        return kind(text) if kind is float else int(text, 10)
    except ValueError:
        raise ValidationError(f"a limit must be a {'number' if kind is float else 'whole number'} or 'none', "
                              f"got {quote(text)}") from None


#: The rate's bucket starts, after an idle spell, with this many seconds of tokens (at least
#: one): a topic that was idle starts a tenth of a second's worth at once, not a burst.
BURST_SECONDS = 0.1
#: While consumers keep leasing, the bucket keeps up to this many seconds of tokens, so pulls
#: that come late on a busy machine catch up instead of losing the tokens that accrued meanwhile
#: (a bucket of a tenth of a second loses all but that much of every longer gap). A gap longer
#: than this is idleness: the bucket starts over at BURST_SECONDS.
CATCH_UP_SECONDS = 1.0
#: How many due messages a per-key lock looks at for each one it may take: keys at their limit
#: are passed over, up to this depth.
KEY_WINDOW = 10
#: How deep a per-key lock of the SQL storages reads first; it reads the whole window only when
#: keys at their limit leave it short.
FIRST_DEPTH = 2


def refill(tokens: Optional[float], at: Optional[datetime], rate: float, now: datetime) -> float:
    """The bucket's tokens at ``now``: what it held at ``at`` plus ``rate`` per second since, at
    most CATCH_UP_SECONDS' worth. A bucket never used, or left alone longer than
    CATCH_UP_SECONDS, starts over at BURST_SECONDS' worth; a clock that went back adds nothing."""
    burst = max(1.0, rate * BURST_SECONDS)
    if tokens is None or at is None or (now - at).total_seconds() > CATCH_UP_SECONDS:
        return burst
    return min(max(burst, rate * CATCH_UP_SECONDS), tokens + max(0.0, (now - at).total_seconds()) * rate)


def within_key_limit(candidates: Sequence[tuple[int, Optional[str]]], held: dict[str, int], per_key: int,
                     allowed: int) -> list[int]:
    """The ids of ``candidates`` (``(id, flow_key)`` in the lock's order) a lock takes: at most
    ``allowed``, passing over those whose key has ``per_key`` RUNNING already (``held``, counting
    what this lock takes). Messages without a key are not limited by it."""
    held = dict(held)
    chosen: list[int] = []
    for id, key in candidates:
        if key is not None:
            if held.get(key, 0) >= per_key:
                continue
            held[key] = held.get(key, 0) + 1
        chosen.append(id)
        if len(chosen) == allowed:
            break
    return chosen
