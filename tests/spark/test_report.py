"""The report job: hourly statistics over live + archived messages, checked against an
independent plain-Python computation on the same generated rows."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta

import pytest

from tests.spark.data import insert_rows, message_rows, query, set_topic
from tidemq_pipeline.archive import run_archive
from tidemq_pipeline.report import run_report

HOUR = timedelta(hours=1)


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _pct(values, p):
    if not values:
        return None
    ordered = sorted(values)
    rank = p * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(delta: timedelta) -> float:
    return delta / timedelta(microseconds=1) / 1000.0


def expected_stats(rows):
    counts = defaultdict(lambda: defaultdict(int))
    lateness, duration = defaultdict(list), defaultdict(list)
    for r in rows:
        t = r["topic"]
        counts[t, _hour(r["add_time"])]["produced"] += 1
        if r["status"] in ("SUCCESS", "FAIL"):
            key = (t, _hour(r["finish_time"]))
            counts[key]["succeeded" if r["status"] == "SUCCESS" else "failed"] += 1
            duration[key].append(_ms(r["finish_time"] - r["start_time"]))
        if r["status"] != "NEW":
            key = (t, _hour(r["start_time"]))
            counts[key]  # an hour with activity
            lateness[key].append(_ms(r["start_time"] - r["effect_time"]))
        for line in r["trace"].splitlines():
            stamp, event = line.split(" ")[:2]
            at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
            if event in ("RETRY", "LEASE_EXPIRED"):
                counts[t, _hour(at)]["retried" if event == "RETRY" else "lease_expired"] += 1
    result = {}
    for topic in {t for t, _ in counts}:
        hours = [h for t, h in counts if t == topic]
        hour = min(hours)
        while hour <= max(hours):
            end = hour + HOUR
            backlog = sum(1 for r in rows if r["topic"] == topic and max(r["add_time"], r["order_time"]) < end
                          and not (r["status"] in ("SUCCESS", "FAIL") and r["finish_time"] < end))
            c = counts.get((topic, hour), {})
            row = {k: c.get(k, 0) for k in ("produced", "succeeded", "failed", "retried", "lease_expired")}
            row["backlog"] = backlog
            for name, values in (("lateness", lateness[topic, hour]), ("duration", duration[topic, hour])):
                for label, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                    row[f"{name}_{label}_ms"] = _pct(values, p)
            result[topic, hour] = row
            hour = end
    return result


def test_report_over_live_and_archive_matches_an_independent_computation(spark, db, tmp_path):
    rows = message_rows(2500, topics=("t.alpha", "t.beta"), hours=5, seed=11)
    insert_rows(db, rows)
    set_topic(db, "t.beta", retention_days=365_000)  # t.beta stays live, t.alpha's finished rows move
    archive = str(tmp_path / "archive")
    moved = run_archive(spark, db, archive, batch_rows=1000)
    assert moved.deleted == sum(1 for r in rows if r["topic"] == "t.alpha" and r["status"] in ("SUCCESS", "FAIL")) > 0

    summary = run_report(spark, db, archive)

    assert summary.read == len(rows)
    expected = expected_stats(rows)
    names = ("produced", "succeeded", "failed", "retried", "lease_expired", "backlog", "lateness_p50_ms",
             "lateness_p95_ms", "lateness_p99_ms", "duration_p50_ms", "duration_p95_ms", "duration_p99_ms")
    stored = {(r[0], r[1]): dict(zip(names, r[2:])) for r in
              query(db, f"SELECT topic, hour, {', '.join(names)} FROM tidemq_topic_stats")}
    assert set(stored) == set(expected)
    assert sum(r["retried"] for r in expected.values()) > 0 and sum(r["lease_expired"] for r in expected.values()) > 0
    for key, want in expected.items():
        got = stored[key]
        for name in names:
            if want[name] is None:
                assert got[name] is None, (key, name)
            else:
                assert got[name] == pytest.approx(want[name], abs=1e-6), (key, name, got[name], want[name])

    # A second run replaces the rows instead of adding to them.
    run_report(spark, db, archive)
    assert query(db, "SELECT COUNT(*) FROM tidemq_topic_stats")[0][0] == len(expected)
