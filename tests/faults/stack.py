"""A tidemq stack of real processes for the server-fault tests, and what those tests read back:
process logs (does a fault show up once, not once per retry?), liveness, handler re-runs."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from tests.observe import all_messages, count, handler_runs
from tests.processes import TIDEMQ, start_broker_process

__all__ = ["Stack", "claims", "fault_records", "reruns", "successes"]

_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) ")
_SAID = {"INFO", "WARNING", "ERROR", "CRITICAL"}  # what a process logs by default


def fault_records(path: Path, pattern: str) -> list[str]:
    """The records of a process log at INFO or above whose text (logger name and traceback
    included) matches ``pattern`` (a regular expression, case-insensitive)."""
    records: list[tuple[str, list[str]]] = []
    for line in path.read_text(errors="replace").splitlines():
        match = _RECORD.match(line)
        if match:
            records.append((match["level"], [line]))
        elif records:
            records[-1][1].append(line)  # a traceback or a message of several lines
    wanted = re.compile(pattern, re.IGNORECASE)
    return ["\n".join(lines) for level, lines in records if level in _SAID and wanted.search("\n".join(lines))]


def claims(storage, topic: str, log: Path) -> list[float]:
    """Seconds from each message's commit to the start of its first handler run, sorted (the
    handler log's start times are the worker's clock; brokers and workers share this host's)."""
    first: dict[int, float] = {}
    for line in log.read_text().splitlines():
        msg_id, _pid, _attempt, start, _end = line.split()
        first[int(msg_id)] = min(float(start), first.get(int(msg_id), float("inf")))
    epoch = datetime(1970, 1, 1)
    return sorted(first[m.id] - (m.add_time - epoch).total_seconds()
                  for m in all_messages(storage, topic) if m.id in first)


def reruns(log: Path) -> dict[int, int]:
    """Messages whose handler ran to completion more than once: {id: runs}."""
    return {msg_id: n for msg_id, n in handler_runs(log).items() if n > 1}


class Stack:
    """``brokers`` broker processes and ``workers`` worker processes running
    ``tests.faults.handlers_faults`` with ``env``; ``spawn`` SIGKILLs whatever is left at teardown."""

    def __init__(self, spawn, tmp_path: Path, env: dict, brokers: int = 1, workers: int = 2,
                 worker_args: tuple[str, ...] = ()) -> None:
        self.spawn, self.tmp_path, self.env = spawn, tmp_path, env
        self.brokers = {f"broker{i}": start_broker_process(spawn, tmp_path, env, f"broker{i}")[0]
                        for i in range(brokers)}
        self.workers = {f"worker{i}": spawn(f"worker{i}", TIDEMQ + ["worker", "tests.faults.handlers_faults",
                                                                     *worker_args], env)
                        for i in range(workers)}

    @property
    def processes(self) -> dict:
        return {**self.brokers, **self.workers}

    def assert_alive(self) -> None:
        """No process exited (a crash, or a restart loop's first step)."""
        exited = {name: proc.returncode for name, proc in self.processes.items() if proc.poll() is not None}
        assert not exited, f"processes exited: {exited}"

    def fault_records(self, pattern: str) -> dict[str, list[str]]:
        """:func:`fault_records` of every process log, by process name."""
        return {name: fault_records(proc.log_path, pattern) for name, proc in self.processes.items()}

    def assert_fault_named_once(self, pattern: str, at_most: int = 2, named: bool = True) -> str:
        """Every process names the fault (``pattern``) in at most ``at_most`` records (by default
        one when it begins, one when it ends: not one per retry) and, when ``named``, at least one
        process names it at all; returns the count per process."""
        found = self.fault_records(pattern)
        noisy = {name: records for name, records in found.items() if len(records) > at_most}
        assert not noisy, "a fault logged again and again: " + "; ".join(
            f"{name}: {len(records)} records, e.g. {records[:3]}" for name, records in noisy.items())
        assert any(found.values()) or not named, f"no process log names the fault ({pattern!r})"
        return ", ".join(f"{name} {len(records)}" for name, records in sorted(found.items()))


def successes(storage, topic: str) -> int:
    """How many messages of ``topic`` succeeded so far."""
    return count(storage, topic, "SUCCESS")
