"""The pressure scenario's figures, computed after each run from what it kept: the producers'
calls, the workers' handler records, the rows the database holds, the history-length samples.

Pure functions of those inputs, so they are tested without servers (tests/bench).

- completion: SUCCESS rows by their ``finish_time`` (the broker's clock, same machine);
- claim latency: a due-now message's first handler start - the moment its produce call was
  sent, by the phase it was sent in; split into the call's answer (sent -> answered) and the
  pickup (answered -> first handler start);
- lateness: a delayed message's first handler start - its effect_time, by the phase it was due in;
- queue depth: due and not yet started, at each whole second: messages whose
  max(add_time, effect_time) has passed minus those whose first handler start has;
- recovery: seconds from the fault's end to the start of the first 1 s window (sliding in
  0.1 s steps) that completes at least ``fraction`` x the clean phase's rate (a backlog being
  worked off meets it at once, so beside it:)
- pace: seconds from the fault's end to the first 1 s window of sends whose claim p99 is back
  within a limit (2 x the clean p99 + 20 ms);
- duplicates: messages started more than once; excused when every start but the last was in
  a process the benchmark killed, before it was dead.
"""

from __future__ import annotations

import glob
import os
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from .openloop import Call
from .report import percentile

__all__ = ["Start", "Phase", "read_records", "first_starts", "phase_figures", "depth_series", "recovery_seconds",
           "drain_seconds", "pace_seconds", "duplicates", "window_rate", "percentile_ms", "remove_records"]


@dataclass(frozen=True)
class Start:
    """One handler start as a worker recorded it."""

    id: int
    attempt: int
    at: float
    effect: float
    sent: Optional[float]
    kind: str
    pid: int


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class Row:
    """A message as the database holds it after the run (epoch seconds; finish None if not done)."""

    id: int
    status: str
    attempt: int
    added: float
    effect: float
    finish: Optional[float]


def read_records(prefix: str) -> list[Start]:
    """Every ``<prefix>.<pid>`` file the workers wrote (benchmarks/consumers.py)."""
    starts = []
    for path in glob.glob(prefix + ".*"):
        pid = int(path.rsplit(".", 1)[1])
        with open(path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) != 6:
                    continue  # a line cut short by kill -9 between its bytes is impossible (one write), but be safe
                sent = None if parts[4] == "-" else float(parts[4])
                starts.append(Start(int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3]), sent,
                                    parts[5], pid))
    return starts


def first_starts(starts: Iterable[Start]) -> dict[int, Start]:
    first: dict[int, Start] = {}
    for s in starts:
        if s.id not in first or s.at < first[s.id].at:
            first[s.id] = s
    return first


def window_rate(finishes: Sequence[float], start: float, end: float) -> float:
    """Completions per second in [start, end) of sorted ``finishes``."""
    return (bisect_left(finishes, end) - bisect_left(finishes, start)) / max(end - start, 1e-9)


def depth_series(rows: Iterable[Row], first: dict[int, Start], start: float, end: float,
                 step: float = 1.0) -> list[tuple[float, int]]:
    """(time, messages due and not yet started) every ``step`` seconds in [start, end)."""
    due, claimed = [], []
    for r in rows:
        due.append(max(r.added, r.effect))
        s = first.get(r.id)
        if s is not None:
            claimed.append(s.at)
    due.sort()
    claimed.sort()
    out, t = [], start
    while t < end:
        out.append((t, bisect_right(due, t) - bisect_right(claimed, t)))
        t += step
    return out


def percentile_ms(values: list[float], p: float) -> Optional[float]:
    """The ``p``-th percentile of seconds ``values``, in ms (None for no values)."""
    return round(percentile(values, p) * 1000, 1) if values else None


def phase_figures(phase: Phase, calls: Sequence[Call], rows: Sequence[Row], finishes: Sequence[float],
                  first: dict[int, Start], depth: Sequence[tuple[float, int]],
                  history: Sequence[tuple[float, Optional[int]]]) -> dict:
    """Every per-phase figure of the table (rates per second, times in ms)."""
    mine = [c for c in calls if phase.holds(c.due)]  # offered: by when it was due to be sent
    sent = [c for c in calls if c.sent and phase.holds(c.sent)]  # errors, latency: by when it was sent
    claims = [s.at - s.sent for s in first.values() if s.kind == "n" and s.sent is not None and phase.holds(s.sent)]
    late = [s.at - s.effect for s in first.values() if s.kind == "d" and phase.holds(s.effect)]
    # Each claim in two parts: its produce call's answer (the group commit and the hop) and the
    # pickup, from that answer to the handler's start (below zero when a hand-off's pull reply
    # beat the producer's; else a lock after the commit: a waiting pull woken, or a busy
    # worker's next pull). Which part grows says where a slower claim comes from.
    split = [(c.latency, first[i].at - c.done) for c in sent if c.done and not c.error for i in c.ids
             if i in first and first[i].kind == "n"]
    depths = [d for t, d in depth if phase.holds(t)]
    hist = [h for t, h in history if phase.holds(t) and h is not None]
    return {
        "offered": round(sum(c.size for c in mine) / phase.seconds, 1),
        "stored": round(sum(1 for r in rows if phase.holds(r.added)) / phase.seconds, 1),
        "done": round(window_rate(finishes, phase.start, phase.end), 1),
        "claim p50": percentile_ms(claims, 50), "claim p99": percentile_ms(claims, 99),
        "claim max": percentile_ms(claims, 100), "claimed": len(claims),
        "answer p50": percentile_ms([a for a, _ in split], 50),
        "pickup p50": percentile_ms([b for _, b in split], 50), "pickup p99": percentile_ms([b for _, b in split], 99),
        "late p99": percentile_ms(late, 99), "late max": percentile_ms(late, 100),
        "early": sum(1 for v in late if v < 0), "delayed": len(late),
        "depth mean": round(sum(depths) / len(depths), 1) if depths else None,
        "depth max": max(depths) if depths else None,
        "history max": max(hist) if hist else None, "history min": min(hist) if hist else None,
        "produce errors": sum(c.size for c in sent if c.error),
        "produce p99": percentile_ms([c.latency for c in sent if c.done], 99),
        "produce max": percentile_ms([c.latency for c in sent if c.done], 100),
        "send lag p99": percentile_ms([c.sent - c.due for c in sent], 99),
        "unsent": sum(c.size for c in mine if not c.sent),
    }


def recovery_seconds(finishes: Sequence[float], fault_end: float, horizon: float, rate: float,
                     fraction: float, step: float = 0.1) -> Optional[float]:
    """Seconds after ``fault_end`` until a 1 s window completes >= ``fraction`` x ``rate``;
    None when no window before ``horizon`` does."""
    need = fraction * rate
    k = 0
    while (t := fault_end + k * step) + 1.0 <= horizon:
        if bisect_left(finishes, t + 1.0) - bisect_left(finishes, t) >= need:
            return round(t - fault_end, 1)
        k += 1
    return None


def pace_seconds(first: dict[int, Start], fault_end: float, horizon: float, limit: float,
                 step: float = 0.1) -> Optional[float]:
    """Seconds after ``fault_end`` until the due-now messages sent in a 1 s window are claimed
    with p99 <= ``limit`` seconds: the pace is back for new work, backlog or not. None when no
    window before ``horizon`` is."""
    claims = sorted((s.sent, s.at - s.sent) for s in first.values() if s.kind == "n" and s.sent is not None)
    sent = [c[0] for c in claims]
    k = 0
    while (t := fault_end + k * step) + 1.0 <= horizon:
        window = [c[1] for c in claims[bisect_left(sent, t):bisect_left(sent, t + 1.0)]]
        if window and percentile(window, 99) <= limit:
            return round(t - fault_end, 1)
        k += 1
    return None


def drain_seconds(depth: Sequence[tuple[float, int]], fault_end: float, level: int) -> Optional[float]:
    """Seconds after ``fault_end`` until the depth is back at ``level``; None if it never is."""
    for t, d in depth:
        if t >= fault_end and d <= level:
            return round(t - fault_end, 1)
    return None


@dataclass
class Duplicates:
    """Messages started more than once: excused (every earlier start in a process the benchmark
    killed, before it was dead), and not (``same_process``: two starts in one process)."""

    excused: list[int] = field(default_factory=list)
    unexcused: list[int] = field(default_factory=list)
    same_process: list[int] = field(default_factory=list)
    where: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # unexcused id -> (pid, start)


def duplicates(starts: Iterable[Start], killed: dict[int, float]) -> Duplicates:
    runs: dict[int, list[Start]] = {}
    for s in starts:
        runs.setdefault(s.id, []).append(s)
    out = Duplicates()
    for msg_id, mine in runs.items():
        if len(mine) < 2:
            continue
        mine.sort(key=lambda s: s.at)
        if all(s.pid in killed and s.at < killed[s.pid] for s in mine[:-1]):
            out.excused.append(msg_id)
            continue
        out.unexcused.append(msg_id)
        out.where[msg_id] = [(s.pid, round(s.at, 3)) for s in mine]
        if len({s.pid for s in mine}) < len(mine):
            out.same_process.append(msg_id)
    return out


def remove_records(prefix: str) -> None:
    for path in glob.glob(prefix + ".*"):
        os.remove(path)
