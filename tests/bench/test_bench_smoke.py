"""The benchmark is the project's measuring instrument: every scenario must run on every commit.

``python -m benchmarks --smoke`` runs them all at tiny sizes against servers it starts itself
(no target is judged: the figures of a two-minute run mean nothing), and a signal stops
everything it started.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from benchmarks.__main__ import SCENARIOS
from benchmarks.env import descendants, exited
from tests.servers import wait_until

pytestmark = pytest.mark.slow


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


def _run_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tidemq-bench-*")))


def test_every_scenario_runs_at_smoke_size(tmp_path):
    out = tmp_path / "smoke.json"
    before = _run_dirs()
    run = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"the smoke run failed:\n{_tail(run.stderr)}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    # A run that failed nowhere leaves no directory of logs behind, except a pressure's whose
    # outcome found something to explain (named in its result).
    kept = {r["logs"] for r in doc["figures"]["pressure"]["results"] if r["logs"]}
    assert _run_dirs() - before <= kept, sorted(_run_dirs() - before)
    ran = {row["scenario"] for row in doc["table"] if row["figure"] == "scenario seconds"}
    assert ran == set(SCENARIOS)
    # Each scenario measured something besides its own duration.
    measured = {row["scenario"] for row in doc["table"] if row["figure"] not in
                ("scenario seconds", "load average at start / end")}
    assert set(SCENARIOS) <= measured
    # The broker's own share of a produce() call, read from its metrics endpoint at each thread count.
    [split] = [row["value"] for row in doc["table"] if row["figure"] == "tidemq produce(): broker ms"]
    assert split and all(ms is not None and ms > 0 for ms in split.values()), split


def _worker_running(pid: int) -> list[int]:
    """The run's descendants once one of them is a tidemq worker (the cluster is fully up)."""
    found = descendants(pid)
    for p in found:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                if b"worker\0benchmarks.consumers" in fh.read():
                    return found
        except OSError:
            continue
    return []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_server_and_process_the_run_started(tmp_path, sig):
    log = tmp_path / "run.log"
    with open(log, "w") as fh:  # a file, not a pipe: a full pipe would stall the run
        run = subprocess.Popen([sys.executable, "-m", "benchmarks", "--smoke", "consume", "--out",
                                str(tmp_path / "out.json")], stdout=fh, stderr=fh)
    try:
        started = wait_until(lambda: _worker_running(run.pid), 120, 0.1, "the run's workers")
        # MariaDB, ZooKeeper, a broker and workers at least.
        assert len(started) >= 4
        seen = set(started)
        run.send_signal(sig)
        deadline = time.monotonic() + 90
        while run.poll() is None and time.monotonic() < deadline:
            seen.update(descendants(run.pid))  # processes started while it was stopping count too
            time.sleep(0.05)
        assert run.poll() is not None, "the run did not exit within 90 s of the signal"
        alive = [p for p in seen if not exited(p)]
        assert alive == [], f"still running after the run exited: {alive}\n{_tail(log.read_text())}"
        # A run stopped before its end keeps its processes' logs and says where.
        [kept] = re.findall(r"the logs of this run's brokers and workers are in (\S+)", log.read_text())
        assert os.path.isdir(kept) and any(name.startswith("worker-") for name in os.listdir(kept))
        shutil.rmtree(kept)
    finally:
        if run.poll() is None:
            run.kill()
        run.wait(10)
