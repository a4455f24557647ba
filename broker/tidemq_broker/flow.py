"""A topic's flow limits as operators give them (CLI, console): checked, then stored.

The lock enforces them (``storages/flow.py``); see docs/ARCHITECTURE.md, "Flow control".
"""

from __future__ import annotations

import math
from typing import Optional, Union

from tidemq.errors import ValidationError, quote

from .storage import FlowLimits

__all__ = ["MAX_RUNNING_LIMIT", "MAX_RATE", "check_limits", "parse_limit"]

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
