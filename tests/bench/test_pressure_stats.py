"""The pressure scenario's arithmetic: recovery, drain, queue depth, duplicates, per-phase figures."""

from __future__ import annotations

from benchmarks.openloop import Call
from benchmarks.pressure_report import markdown
from benchmarks.pressure_stats import (Phase, Row, Start, depth_series, drain_seconds, duplicates, first_starts,
                                       pace_seconds, phase_figures, read_records, recovery_seconds)


def _start(i: int, at: float, pid: int = 1, kind: str = "n", sent: float = 0.0, effect: float = 0.0) -> Start:
    return Start(i, 1, at, effect, sent, kind, pid)


def test_recovery_is_the_first_window_back_at_the_clean_rate() -> None:
    # 100/s until 10 s, nothing from 10 to 13 s, 50/s from 13 to 14 s, 100/s after.
    finishes = [k / 100 for k in range(1000)] + [13 + k / 50 for k in range(50)] + [14 + k / 100 for k in range(600)]
    assert recovery_seconds(finishes, 10.0, 20.0, rate=100, fraction=0.9) == 3.8  # [13.8, 14.8) holds 10 + 80
    assert recovery_seconds(finishes, 10.0, 20.0, rate=100, fraction=0.5) == 3.0
    assert recovery_seconds(finishes, 0.0, 20.0, rate=100, fraction=0.9) == 0.0  # never slowed
    assert recovery_seconds(finishes, 10.0, 13.5, rate=100, fraction=0.9) is None  # not within the horizon


def test_the_pace_is_back_when_new_messages_are_claimed_in_time_again() -> None:
    # Sent every 0.1 s from 0 to 10 s; those sent before 5 s waited until 5 s, later ones 10 ms.
    first = first_starts([_start(k, max(5.0, k / 10 + 0.01), sent=k / 10) for k in range(100)] +
                         [_start(1000, 2.0, kind="d", effect=1.0)])
    assert pace_seconds(first, 3.0, 10.0, limit=0.020) == 2.0
    assert pace_seconds(first, 3.0, 10.0, limit=2.0) == 0.0  # waiting 2 s or less is in the limit from 3.0
    assert pace_seconds(first, 3.0, 4.5, limit=0.020) is None


def test_depth_counts_due_messages_not_yet_started() -> None:
    rows = [Row(1, "SUCCESS", 1, added=0.5, effect=0.5, finish=2.6),   # due at 0.5, started 2.5
            Row(2, "SUCCESS", 1, added=0.5, effect=3.2, finish=3.3),   # delayed: due at 3.2
            Row(3, "NEW", 0, added=1.5, effect=1.5, finish=None)]      # never started
    first = first_starts([_start(1, 2.5), _start(2, 3.25), _start(1, 9.0, pid=2)])
    assert depth_series(rows, first, 0.0, 5.0) == [(0.0, 0), (1.0, 1), (2.0, 2), (3.0, 1), (4.0, 1)]
    assert drain_seconds([(0.0, 0), (1.0, 5), (2.0, 3), (3.0, 1)], 1.0, level=1) == 2.0
    assert drain_seconds([(0.0, 0), (1.0, 5)], 1.0, level=1) is None


def test_a_second_run_is_excused_only_after_its_first_process_was_killed() -> None:
    starts = [_start(1, 1.0, pid=10), _start(1, 5.0, pid=11),   # pid 10 killed at 2: excused
              _start(2, 3.0, pid=10), _start(2, 6.0, pid=11),   # started in 10 after its kill time: not
              _start(3, 1.0, pid=11), _start(3, 2.0, pid=11),   # twice in one live process
              _start(4, 1.0, pid=11)]
    dups = duplicates(starts, killed={10: 2.0})
    assert dups.excused == [1]
    assert sorted(dups.unexcused) == [2, 3]
    assert dups.same_process == [3]
    assert dups.where[3] == [(11, 1.0), (11, 2.0)]


def test_phase_figures_take_each_message_in_the_phase_it_was_sent_or_due_in() -> None:
    phase = Phase("clean", 10.0, 20.0)
    calls = [Call(due=11.0, size=10, sent=11.0, done=11.01, ids=list(range(10))),
             Call(due=12.0, size=10, sent=12.5, done=22.0, error="StorageUnavailableError"),
             Call(due=19.5, size=10),  # never sent
             Call(due=21.0, size=10, sent=21.0, done=21.01)]  # the next phase's
    rows = [Row(i, "SUCCESS", 1, 11.0, 11.0, 11.1) for i in range(10)] + [Row(99, "SUCCESS", 1, 15.0, 16.0, 16.01)]
    first = first_starts([_start(i, 11.0 + (i + 1) / 1000, sent=11.0) for i in range(10)] +
                         [_start(99, 16.004, kind="d", effect=16.0)])
    f = phase_figures(phase, calls, rows, sorted(r.finish for r in rows), first, [(15.0, 3), (16.0, 1)],
                      [(10.5, 100), (11.5, None), (12.5, 900)])
    assert f["offered"] == 3.0 and f["stored"] == 1.1 and f["done"] == 1.1
    assert (f["claim p50"], f["claim p99"], f["claimed"]) == (5.0, 10.0, 10)
    # Answered 10 ms after sending, each started 1..10 ms after sending: picked up 9 ms before
    # the answer to as it came; the failed call and the delayed message are in neither part.
    assert (f["answer p50"], f["pickup p50"], f["pickup p99"]) == (10.0, -5.0, 0.0)
    assert (f["late p99"], f["early"], f["delayed"]) == (4.0, 0, 1)
    assert (f["depth max"], f["history min"], f["history max"]) == (3, 100, 900)
    assert (f["produce errors"], f["unsent"], f["produce max"], f["send lag p99"]) == (10, 10, 9500.0, 500.0)


def test_records_are_read_from_each_workers_file(tmp_path) -> None:
    (tmp_path / "starts.101").write_text("7 1 5.000001 4.000 4.5 n\n8 2 6.5 6.000 - d\n")
    (tmp_path / "starts.102").write_text("7 2 9.0 4.000 4.5 n\n")
    starts = read_records(str(tmp_path / "starts"))
    assert sorted((s.id, s.pid, s.attempt) for s in starts) == [(7, 101, 1), (7, 102, 2), (8, 101, 2)]
    assert first_starts(starts)[7].pid == 101
    assert next(s for s in starts if s.id == 8).sent is None


def test_markdown_has_a_row_per_phase_and_an_outcome_per_pressure() -> None:
    phase = {"offered": 590.0, "stored": 590.0, "done": 585.0, "claim p50": 3.1, "claim p99": 20.0,
             "answer p50": 1.2, "pickup p50": 1.9, "pickup p99": 15.0, "depth max": 4, "history max": 120,
             "produce errors": 0, "late p99": 2.0, "late max": 9.0}
    result = {"kind": "idle-view", "phases": {p: dict(phase) for p in ("warmup", "clean", "stress", "recovery")},
              "pressure": {"rows seen": 1000}, "recovery s": None, "recovery window": 60.0, "drain s": 1.0,
              "pace s": None, "lost": 0, "dup": 0, "dup excused": 2, "over deadline": 0, "exited": [],
              "log lines": {"stress": 3}, "stack stop s": 1.5}
    result["phases"]["stress"]["done"] = 117.0
    overview, phases, outcomes = markdown([result]).split("\n\n")
    assert overview.splitlines()[2] == (
        "| idle-view | 585.0 | 0.2 | 3.1 / 20.0 | 20.0 | 120 → 120 | > 60.0 | 0 | 0 (2) | 0 |")
    table = (phases + "\n" + outcomes).splitlines()
    assert table[4] == (
        "|  | stress | 590.0 | 590.0 | 117.0 | 0.2 | 3.1 / 20.0 | 1.2, 1.9 / 15.0 | 4 | 120 | 0 | 2 / 9 |")
    assert table[-1] == "| idle-view | rows seen 1000 | > 60.0 | > 60.0 | 1 | 0 | 0 (2) | 0 | 0 | 3 | 1.5 |"
