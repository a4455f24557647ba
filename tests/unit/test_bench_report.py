"""The benchmark's report: every figure the table prints is in the JSON document, notes included."""

from __future__ import annotations

import io
import json

from benchmarks.report import Report, percentile, summarize


def test_document_carries_every_row_the_table_prints() -> None:
    out = io.StringIO()
    report = Report(stream=out)
    report.record("consume", "2 worker processes, 1 broker", 11556.7, "msg/s", "wall clock incl. wake-up: 10,352/s")
    report.record("consume", "cpu s/s", {"brokers": 0.27, "mariadb": 1.1}, "cores")
    assert report.target("consume", "ratio 2 workers", 0.72, ">=", 0.6)
    assert not report.target("peers", "consume ratio", 7.5, ">=", 10.0)

    doc = json.loads(Report.dumps(report.document({"cores": 2}, {"rounds": 2})))

    printed = [line for line in out.getvalue().replace("\r\x1b[K", "\n").splitlines() if line.strip()]
    assert len(doc["table"]) == len(printed) - 2  # header and rule
    assert doc["table"][0] == {"scenario": "consume", "figure": "2 worker processes, 1 broker", "value": 11556.7,
                               "unit": "msg/s", "note": "wall clock incl. wake-up: 10,352/s"}
    assert doc["figures"]["consume"]["cpu s/s"] == {"brokers": 0.27, "mariadb": 1.1}
    assert [(c["figure"], c["met"]) for c in doc["targets"]] == [("ratio 2 workers", True), ("consume ratio", False)]
    assert doc["figures"]["peers"]["target consume ratio >= 10.0"] == "MISSED"
    assert doc["machine"] == {"cores": 2} and doc["settings"] == {"rounds": 2}


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 1) == 1.0
    assert percentile(list(reversed(values)), 100) == 100.0
    s = summarize([3.0, 1.0, 2.0])
    assert (s["count"], s["min"], s["p50"], s["max"]) == (3, 1.0, 2.0, 3.0)


def test_percentile_of_few_values() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0], 50) == 1.0  # rank ceil(1.0) = 1
    assert percentile([1.0, 2.0], 51) == 2.0
    assert percentile([], 50) != percentile([], 50)  # NaN
