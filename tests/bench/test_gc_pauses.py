"""The benchmark's record of the cycle collector's pauses in the processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from benchmarks import gc_pauses


def test_a_child_records_its_long_collections_and_a_summary_counts_them_in_the_window(tmp_path):
    prefix = str(tmp_path / "gc")
    # Named a broker by its arguments, as `tidemq broker` is; 300,000 live containers make a
    # full collection last well over 2 ms.
    code = textwrap.dedent("""
        import gc, time
        keep = [[i] for i in range(300_000)]
        began = time.time()
        gc.collect()
        print(began, time.time())
    """)
    done = subprocess.run([sys.executable, "-c", code, "broker"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **gc_pauses.env(prefix)})
    assert done.returncode == 0, done.stderr
    began, ended = map(float, done.stdout.split())
    [name] = os.listdir(tmp_path)
    assert name.startswith("gc.broker.")
    found = gc_pauses.read(prefix)
    [(at, generation, ms)] = [p for p in found["broker"] if began <= p[0] <= ended]
    assert generation == 2 and ms >= 2.0
    # The short ones are counted at exit (the interpreter's last collection comes after it).
    assert [line for line in open(tmp_path / name) if line.startswith("short ")]
    summary = gc_pauses.summary(found, began, ended)
    assert summary["broker"]["pauses"] == 1 and summary["broker"]["max ms"] == round(ms, 1)
    assert gc_pauses.summary(found, began - 60, began - 30)["broker"] == {
        "pauses": 0, "over 10 ms": 0, "max ms": None, "ms per s": 0.0}


def test_without_the_variable_nothing_is_recorded(tmp_path):
    env = {**os.environ, **gc_pauses.env(str(tmp_path / "gc"))}
    del env["BENCH_GC_FILE"]
    done = subprocess.run([sys.executable, "-c", "import gc; gc.collect()", "worker"], env=env, timeout=60)
    assert done.returncode == 0 and os.listdir(tmp_path) == []
