"""Figures as they are measured: a progress line, a table row per figure, one JSON document."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Optional, Sequence

__all__ = ["Report", "percentile", "summarize"]


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    # Rank ceil(p% of n), 1-based: the smallest value with at least p% of values at or below it.
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, min, p50, p90, p99, max of latencies or lateness (ms)."""
    return {"count": len(values), "min": round(min(values), 3) if values else float("nan"),
            "p50": round(percentile(values, 50), 3), "p90": round(percentile(values, 90), 3),
            "p99": round(percentile(values, 99), 3), "max": round(max(values), 3) if values else float("nan")}


class Report:
    """Collects every figure under ``scenario -> name`` and prints the table as it grows."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.figures: dict[str, dict[str, Any]] = {}
        self.checks: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []  # the table as printed, units and notes included
        self.started = time.monotonic()
        self._header = False

    def progress(self, text: str) -> None:
        """A transient status line (overwritten by the next one or by a table row)."""
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r\033[K[{elapsed:6.1f}s] {text}")
        self.stream.flush()

    def record(self, scenario: str, name: str, value: Any, unit: str = "", note: str = "") -> Any:
        """Store a figure and print its table row."""
        self.figures.setdefault(scenario, {})[name] = value
        self.rows.append({"scenario": scenario, "figure": name, "value": value, "unit": unit, "note": note})
        if not self._header:
            self._row("scenario", "figure", "value", "unit", "note")
            self._row("-" * 10, "-" * 34, "-" * 12, "-" * 8, "-" * 20)
            self._header = True
        if isinstance(value, float):
            shown = f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
        elif isinstance(value, dict):
            shown = " ".join(f"{k}={v}" for k, v in value.items())
        else:
            shown = str(value)
        self._row(scenario, name, shown, unit, note)
        return value

    def target(self, scenario: str, name: str, value: float, op: str, limit: float) -> bool:
        """Record whether ``value op limit`` holds (op is '>=' or '<='); the table shows it."""
        met = value >= limit if op == ">=" else value <= limit
        self.checks.append({"scenario": scenario, "figure": name, "value": value, "target": f"{op} {limit}",
                            "met": met})
        self.record(scenario, f"target {name} {op} {limit}", "met" if met else "MISSED", "", f"{value:.3f}")
        return met

    def _row(self, *cells: str) -> None:
        widths = (10, 34, 12, 8, 0)
        line = "  ".join(str(c).ljust(w) if w else str(c) for c, w in zip(cells, widths))
        self.stream.write(f"\r\033[K{line.rstrip()}\n")
        self.stream.flush()

    def document(self, machine: dict, settings: dict, errors: Optional[dict] = None) -> dict:
        return {"machine": machine, "settings": settings, "figures": self.figures, "targets": self.checks,
                "table": self.rows,
                "errors": errors or {}, "duration_s": round(time.monotonic() - self.started, 1)}

    @staticmethod
    def dumps(document: dict) -> str:
        return json.dumps(document, indent=2, sort_keys=False, default=str)
