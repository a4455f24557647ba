"""Backoff choices and trace lines."""

from __future__ import annotations

import random
from datetime import datetime

from tidemq import trace
from tidemq.lifecycle import next_delay
from tidemq_broker.storage import StoredMessage, TopicSettings


def _msg(attempt, remaining, schedule=None):
    t = datetime(2026, 1, 1)
    return StoredMessage(1, "t", "1", "RUNNING", t, t, remaining, schedule, attempt, 30, "x", t, "c", None, 0, "",
                         t, t, t, None)


def test_schedule_gives_one_delay_per_further_attempt():
    schedule = [0.0, 120.0, 600.0]
    assert [next_delay(_msg(a, r, schedule), TopicSettings("t")) for a, r in ((1, 3), (2, 2), (3, 1))] == schedule


def test_default_backoff_is_exponential_jittered_and_capped():
    settings = TopicSettings("t", retry_base=10, retry_max=100)
    rng = random.Random(7)
    delays = [next_delay(_msg(a, 5), settings, rng) for a in (1, 2, 3, 4, 5, 6)]
    ceilings = [10, 20, 40, 80, 100, 100]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))


def test_trace_lines_round_trip_and_flatten_errors():
    at = datetime(2026, 11, 23, 1, 2, 3, 456789)
    line = trace.line(at, "RETRY", consumer="w-1", error="Traceback\n  boom  " + "x" * 600, empty="")
    assert line.startswith("2026-11-23T01:02:03.456Z RETRY consumer=w-1 error=Traceback_boom_")
    assert line.endswith("...\n") and line.count("\n") == 1 and "empty" not in line
    [entry] = trace.parse(line)
    assert entry["event"] == "RETRY" and entry["consumer"] == "w-1"
