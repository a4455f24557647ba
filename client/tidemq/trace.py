"""Trace lines: one line per state change, appended to the message's trace column.

A line reads ``<UTC time> <EVENT> key=value ...``; values never contain spaces or newlines
(errors are flattened and truncated), so lines can be parsed back by the console and pipeline.
"""

from __future__ import annotations

import re
from datetime import datetime

__all__ = ["ERROR_TEXT_LIMIT", "line", "parse"]

ERROR_TEXT_LIMIT = 500  # characters of a handler's error kept per attempt
_SPACE = re.compile(r"\s+")


def _clean(value: object) -> str:
    text = _SPACE.sub("_", str(value))
    return text[:ERROR_TEXT_LIMIT] + ("..." if len(text) > ERROR_TEXT_LIMIT else "")


def line(at: datetime, event: str, **fields: object) -> str:
    """Format one trace line (with its newline); None values are left out."""
    parts = [at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z", event]
    parts += [f"{key}={_clean(value)}" for key, value in fields.items() if value is not None and value != ""]
    return " ".join(parts) + "\n"


def parse(trace: str) -> list[dict[str, str]]:
    """Split a trace column into dicts with 'time', 'event' and the line's fields."""
    entries = []
    for raw in trace.splitlines():
        bits = raw.split(" ")
        if len(bits) < 2:
            continue
        entry = {"time": bits[0], "event": bits[1]}
        for bit in bits[2:]:
            key, _, value = bit.partition("=")
            entry[key] = value
        entries.append(entry)
    return entries
