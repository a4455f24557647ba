"""A failed test's report carries its processes' last log lines (tests/failure_context.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import failure_context
from tests.failure_context import forget_touched, touched
from tests.servers import ZooKeeper


def test_a_failure_reports_each_spawned_process_with_its_state_and_last_lines(spawn):
    talker = spawn("talker", [sys.executable, "-c", "print('\\n'.join(f'line {i}' for i in range(100)))"])
    talker.wait(10)
    sleeper = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    (title, text), (title2, text2) = failure_context.sections({"spawn": spawn})
    assert title == f"talker (exited 0): last {failure_context.LINES} lines of its log"
    assert text.splitlines() == [f"line {i}" for i in range(100 - failure_context.LINES, 100)]
    assert title2.startswith("sleeper (running)") and text2 == "(empty)"
    sleeper.kill()


def test_a_tail_reads_only_the_end_of_a_large_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("".join(f"{i:09d}\n" for i in range(100_000)))
    assert failure_context.tail(log, lines=3, chars=25).splitlines() == ["000099998", "000099999"]
    assert failure_context.tail(tmp_path / "missing.log").startswith("(unreadable: ")


def test_a_test_without_processes_or_galera_adds_nothing():
    assert failure_context.sections({}) == []


def test_a_failure_reports_each_server_the_test_started_stopped_or_killed(tmp_path):
    server = ZooKeeper(directory=str(tmp_path / "zk"))  # not started: its state and log are what is read
    Path(server.log_path).write_text("".join(f"zk line {i}\n" for i in range(80)))
    forget_touched()
    assert failure_context.sections({}, touched()) == []
    server.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server.proc.wait(10)
    server.stop()
    server.kill()  # touched twice, reported once
    [(title, text)] = failure_context.sections({}, touched())
    assert title == (f"ZooKeeper on port {server.port} (exited 3), started, stopped or killed in this test: "
                     f"last {failure_context.LINES} lines of zk.log")
    assert text.splitlines() == [f"zk line {i}" for i in range(80 - failure_context.LINES, 80)]
    server.cleanup()  # a test that removes its own server in a finally, before the report
    assert not Path(server.log_path).exists()
    assert failure_context.sections({}, touched()) == [(title, text)]
    forget_touched()
