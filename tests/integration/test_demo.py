"""`make demo` as a user runs it: `tidemq dev --demo`, a real process on SQLite and in-process
coordination, whose narration shows each model, results, a failure, a cancel and a workflow."""

from __future__ import annotations

import os
import subprocess

from tests.processes import TIDEMQ


def test_the_demo_runs_every_part_and_says_how_each_ended(tmp_path):
    # Its SQLite file goes in a directory of its own under TMPDIR: here, this test's.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run(TIDEMQ + ["dev", "--demo"], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    for line in ("QUEUE  order 6 closed, message 6, attempt 2",
                 "SERIAL ledger entry b applied",
                 "TOPIC  cache key 'users' dropped by this worker",
                 "report 2026-11 result: {'month': '2026-11', 'rows': 1000}",
                 "report 2026-13 failed, result() raises RemoteError: ValueError: no sales recorded",
                 "cancel(running=True) -> True",
                 "report 2025 ended CANCELLED, result() raises MessageCancelledError",
                 "workflow SUCCEEDED, 5 steps; merge's result: {'rows': 250}",
                 "stored: demo.orders: SUCCESS 6",
                 "stored: demo.reports: CANCELLED 1, FAIL 1, SUCCESS 1",
                 "demo finished: every message ended as shown"):
        assert line in out, f"{line!r} missing from the demo's output:\n{out}"
    # The handler saw its cancel before its last part: it ran part by part, not to the end.
    stopped = next(text for text in out.splitlines() if "report 2025 stops at part" in text)
    assert int(stopped.split("part ")[1].split(" of")[0]) < 200, stopped
    store = next(text for text in out.splitlines() if "SQLite store in " in text).split("SQLite store in ")[1]
    assert os.path.dirname(store.split(",")[0]) == str(tmp_path), store
