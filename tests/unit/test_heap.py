"""tidemq's processes take what they built while starting out of the cycle collector's walks.

``gc.freeze`` is process-wide, so the collector itself is exercised in a child interpreter;
this process only checks that the commands call it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tidemq import heap, worker_command
from tidemq.config import Settings
from tidemq.errors import ConfigurationError


def _child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settling_freezes_what_lives_and_still_collects_cycles_made_afterwards():
    out = _child("""
        import gc
        from tidemq import heap
        before = [[i] for i in range(50_000)]  # start-up's objects: alive for good
        assert gc.get_freeze_count() == 0
        assert heap.settle() is True
        frozen = gc.get_freeze_count()
        assert frozen >= 50_000, frozen
        # A full collection no longer walks them ...
        assert all(o is not before for o in gc.get_objects(generation=2))
        # ... and a cycle made afterwards is still freed.
        cycle = []
        cycle.append(cycle)
        del cycle
        print(gc.collect())
    """)
    assert int(out) >= 1


@pytest.mark.parametrize("setup, mode", [("", "python"), ("gc.disable()", "settled")])
def test_python_mode_or_a_disabled_collector_is_left_alone(setup, mode):
    out = _child(f"""
        import gc
        from tidemq import heap
        {setup}
        print(heap.settle({mode!r}), gc.get_freeze_count(), gc.isenabled())
    """)
    assert out == f"False 0 {not setup}"


def test_the_mode_is_read_from_the_environment_and_checked():
    assert Settings.from_env({}).gc == "settled"
    assert Settings.from_env({"TIDEMQ_GC": " Python "}).gc == "python"
    with pytest.raises(ConfigurationError, match="TIDEMQ_GC must be one of settled, python, got 'off'"):
        Settings.from_env({"TIDEMQ_GC": "off"})


def test_the_worker_command_settles_once_its_modules_are_imported_and_before_it_runs(monkeypatch):
    events: list[str] = []

    class Worker:
        def __init__(self, *args, **kwargs) -> None:
            events.append("built")

        def run(self) -> None:
            events.append("run")

    monkeypatch.setattr(worker_command, "Worker", Worker)
    monkeypatch.setattr(worker_command, "Client", lambda settings: object())
    monkeypatch.setattr(heap, "settle", lambda mode: events.append(f"settle {mode}"))
    assert worker_command.run_worker(Settings.from_env({"TIDEMQ_GC": "python"}), specs=[]) == 0
    assert events == ["built", "settle python", "run"]
