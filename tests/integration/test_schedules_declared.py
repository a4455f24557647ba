"""Schedules declared in code (tidemq.schedule, @mq_consumer(schedule=...)) through a broker on
MariaDB + ZooKeeper, and from the shell (`tidemq schedule ...`)."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from tests.processes import TIDEMQ, process_env
from tidemq import Worker, mq_consumer
from tidemq.errors import InvalidScheduleError, InvalidTopicError
from tidemq.consumer import registered_consumers


def test_declare_in_code_is_idempotent_and_bad_input_names_the_form(client, broker):
    assert client.schedule("reports", "reports.daily", "0 6 * * 1-5", {"kind": "daily"},
                           timezone="Europe/Berlin", missed="skip", retry=2) is True
    assert client.schedule("reports", "reports.daily", "0 6 * * 1-5", {"kind": "daily"},
                           timezone="Europe/Berlin", missed="skip", retry=2) is False
    stored = broker.storage.schedules.get_schedule("reports")
    assert (stored.topic, stored.cron, stored.timezone, stored.data, stored.missed, stored.retry) == \
        ("reports.daily", "0 6 * * 1-5", "Europe/Berlin", '{"kind":"daily"}', "skip", 2)
    with pytest.raises(InvalidScheduleError, match="5 fields"):
        client.schedule("bad", "reports.daily", "every monday")
    with pytest.raises(InvalidScheduleError, match="IANA"):
        client.schedule("bad", "reports.daily", "0 6 * * *", timezone="Berlin/Mitte")
    with pytest.raises(InvalidTopicError):
        client.schedule("bad", "bad topic", "0 6 * * *")
    assert broker.storage.schedules.get_schedule("bad") is None


def test_a_consumer_declared_with_a_schedule_receives_its_ticks(client, broker):
    got, done = [], threading.Event()

    @mq_consumer("sched.consumer", schedule="* * * * * *")
    def handle(message):
        got.append(message.effect_time)
        if len(got) >= 3:
            done.set()

    worker = Worker(registered_consumers(), client=client).start()
    try:
        assert broker.storage.schedules.get_schedule("sched.consumer").cron == "* * * * * *"
        assert done.wait(30), "three ticks within 30 s"
    finally:
        worker.stop()
    assert all(t.microsecond == 0 for t in got) and len(set(got)) == len(got)


def test_schedules_from_the_shell(settings):
    env = {**os.environ, **process_env(settings)}

    def run(*args):
        return subprocess.run(TIDEMQ + ["schedule", *args], capture_output=True, text=True, timeout=120, env=env)

    added = run("add", "nightly", "reports.build", "30 2 * * *", "--timezone", "America/New_York",
                "--data", '{"n": 1}', "--missed", "skip")
    assert added.returncode == 0 and "nightly added; next tick" in added.stdout, added.stderr
    bad = run("add", "x", "t", "30 2 * *")
    assert bad.returncode == 2 and "5 fields" in bad.stderr
    assert run("pause", "nightly").returncode == 0
    listed = run("list").stdout
    assert "nightly" in listed and "America/New_York" in listed and "paused" in listed
    assert run("resume", "nightly").returncode == 0 and "active" in run("list").stdout
    assert run("remove", "nightly").returncode == 0
    gone = run("remove", "nightly")
    assert gone.returncode == 1 and "no schedule named 'nightly'" in gone.stdout
