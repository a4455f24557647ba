"""``tidemq worker --max-idle``: a real worker process leaves (status 0, after its drain) once it
has held no message for that long, and never while a handler runs or messages keep coming."""

from __future__ import annotations

import time

from tests.processes import TIDEMQ, process_env, wait_registered
from tests.servers import wait_until

MAX_IDLE = 2.0


def _finished(log) -> dict[int, tuple[float, float]]:
    if not log.exists():
        return {}
    return {int(i): (float(s), float(e)) for i, s, e in (line.split() for line in log.read_text().splitlines())}


def test_an_idle_worker_exits_after_max_idle_and_a_busy_one_does_not(settings, client, spawn, tmp_path):
    log = tmp_path / "idle.log"
    env = process_env(settings, IDLE_LOG=str(log))
    worker = spawn("worker", [*TIDEMQ, "worker", "tests.integration.handlers_idle", "--max-idle", str(MAX_IDLE),
                              "--drain-timeout", "5"], env)
    wait_registered(client.coordinator, "idle.queue", 1, 30)
    # A handler running longer than --max-idle keeps the worker, and so do messages that come
    # closer together than it: five, one second apart.
    long_id = client.produce("idle.queue", {"sleep": MAX_IDLE * 1.5})
    ids = [long_id]
    for n in range(5):
        ids.append(client.produce("idle.queue", {"n": n}))
        wait_until(lambda: ids[-1] in _finished(log), 30, what=f"message {ids[-1]} handled")
        assert worker.poll() is None, "the worker left while messages kept coming"
        time.sleep(MAX_IDLE / 2)  # the gap between arrivals the test is about, not a wait for a condition
    wait_until(lambda: long_id in _finished(log), 30, what="the long handler done")
    returncode = wait_until(lambda: worker.poll() is not None and (worker.returncode, time.time()), 30, 0.02,
                            "the idle worker to exit")
    code, exited = returncode
    assert code == 0, worker.log_path.read_text()[-2000:]
    runs = _finished(log)
    assert sorted(runs) == sorted(ids)
    last_end = max(end for _, end in runs.values())
    assert exited - last_end >= MAX_IDLE, (exited - last_end, "left before it was idle for --max-idle")
    start, end = runs[long_id]
    assert end - start >= MAX_IDLE * 1.5
    assert "(--max-idle): stopping" in worker.log_path.read_text()
    counts = client.coordinator.consumers("idle.queue")
    assert counts == [], "the worker left its registration behind"


def test_max_idle_refuses_a_value_that_is_not_a_positive_number_of_seconds(spawn, settings):
    for bad, says in (("0", "more than 0"), ("soon", "takes seconds")):
        proc = spawn(f"bad-{bad}", [*TIDEMQ, "worker", "tests.integration.handlers_idle", "--max-idle", bad],
                     process_env(settings, IDLE_LOG="/dev/null"))
        assert proc.wait(30) == 2
        assert says in proc.log_path.read_text()
