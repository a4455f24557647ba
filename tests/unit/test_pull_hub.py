"""The broker's long-poll hub, against the memory storage: wake-ups, a shard's quiet wait and
cancellation. No database, no sleeps."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest

from tests.background import InThread
from tests.servers import wait_until
from tidemq import clock
from tidemq_broker.pulls import PullHub, Quiet, long_poll
from tidemq_broker.records import LeasedBatch
from tidemq_broker.storage import NewRow
from tidemq_broker.storages.memory import open_memory_storage


@pytest.fixture
def storage():
    return open_memory_storage()


def _hub(storage) -> PullHub:
    hub = PullHub(storage.probes, probe_interval=60, recheck=60)  # only notifications wake a waiter here
    hub.start()
    return hub


def test_a_waiting_pull_wakes_when_its_topic_gets_a_due_message(storage):
    hub = _hub(storage)
    attempts: list[datetime] = []
    ready = threading.Event()

    def attempt():
        attempts.append(clock.now())
        return ["leased"] if ready.is_set() else []

    result: list = []
    poller = threading.Thread(target=lambda: result.append(
        long_poll(hub, deadline=_monotonic_in(60), attempt=attempt, next_due=lambda: None, topic="t.hub")))
    poller.start()
    try:
        wait_until(lambda: attempts, 10, what="the first attempt")
        hub.notify("t.other", clock.now())  # another topic: must not count as ours
        ready.set()
        hub.notify("t.hub", clock.now())
        poller.join(30)
        assert result == [["leased"]]
        assert len(attempts) == 2
    finally:
        hub.stop()
        poller.join(5)


def test_stopping_the_hub_ends_waiting_pulls_at_once_with_nothing(storage):
    hub = _hub(storage)
    started = threading.Event()

    def attempt():
        started.set()
        return []

    result: list = []
    poller = threading.Thread(target=lambda: result.append(
        long_poll(hub, deadline=_monotonic_in(60), attempt=attempt, next_due=lambda: None, topic="t.stop")))
    poller.start()
    assert started.wait(10)
    wait_until(lambda: hub._waiters.get("t.stop"), 10, what="the pull to wait")
    hub.stop()
    poller.join(30)
    assert not poller.is_alive() and result == [[]]


def test_a_pull_its_caller_gave_up_ends_at_its_next_wake_instead_of_waiting_on(storage):
    """A consumer cancels its pull when its rank changes; the broker's side must not stay
    registered, waking (and reading its next due time) on every commit until its deadline."""
    hub = _hub(storage)
    attempts: list[datetime] = []
    caller = {"alive": True}

    def attempt():
        attempts.append(clock.now())
        return []

    poller = InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, lambda: None, "t.gone",
                                        alive=lambda: caller["alive"]))
    try:
        wait_until(lambda: hub._waiters.get("t.gone"), 10, what="the pull to wait")
        hub.notify("t.gone", clock.now())
        wait_until(lambda: len(attempts) == 2 and hub._waiters.get("t.gone"), 10, what="the pull to wait again")
        caller["alive"] = False
        hub.notify("t.gone", clock.now())
        assert poller.value(30) == []
        assert len(attempts) == 3 and not hub._waiters.get("t.gone")
    finally:
        hub.stop()
        poller.join(10)


def test_a_pull_after_one_that_took_everything_due_begins_with_the_next_due_time(storage):
    """The re-pull a consumer makes after each delivery: its shard's last lock took all that was
    due and nothing was notified since, so it reads the next due time instead of locking, and
    locks only once something may be due."""
    hub = _hub(storage)
    quiet = Quiet("t.quiet", 0, 2, 0.0, 5)
    calls = {"attempt": 0, "next_due": 0}
    due: list = [None]
    batches: list[list] = [["m1"]]

    def attempt():
        calls["attempt"] += 1
        return batches.pop(0) if batches else []

    def next_due():
        calls["next_due"] += 1
        return due[0]

    def pull() -> InThread:
        return InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, next_due, "t.quiet", quiet=quiet))

    try:
        assert pull().value(10) == ["m1"] and calls == {"attempt": 1, "next_due": 0}  # 1 of 5: all due
        second = pull()
        wait_until(lambda: hub._waiters.get("t.quiet"), 10, what="the second pull to wait")
        assert calls == {"attempt": 1, "next_due": 1}  # no lock: nothing is due
        batches.append(["m2"] * 5)
        hub.notify("t.quiet", clock.now())  # a commit: the waiting pull locks
        assert second.value(10) == ["m2"] * 5 and calls["attempt"] == 2
        batches.append(["m3"])
        assert pull().value(10) == ["m3"] and calls["attempt"] == 3  # the last lock was full: lock first
        due[0] = clock.after(clock.now(), -1)  # due already (a delay ran out): it locks at once
        batches.append(["m4"])
        assert pull().value(10) == ["m4"] and calls["attempt"] == 4
        due[0] = None
        hub.notify("t.quiet", clock.now())  # notified since the last lock: lock first
        batches.append(["m5"])
        assert pull().value(10) == ["m5"] and calls["attempt"] == 5
        # That lock of 5 took 1: the shard is quiet, whatever size the next pull asks for.
        wider = InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, next_due, "t.quiet",
                                           quiet=quiet._replace(limit=7)))
        wait_until(lambda: hub._waiters.get("t.quiet"), 10, what="the wider pull to wait")
        assert calls["attempt"] == 5  # no lock: nothing is due
        batches.append(["m5b"])
        hub.notify("t.quiet", clock.now())
        assert wider.value(10) == ["m5b"] and calls["attempt"] == 6
        other = Quiet("t.quiet", 1, 2, 0.0, 5)  # another shard was never locked: it locks first
        batches.append(["m6"])
        assert InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, next_due, "t.quiet",
                                          quiet=other)).value(10) == ["m6"] and calls["attempt"] == 7
    finally:
        hub.stop()


def test_a_full_lock_that_took_everything_due_leaves_the_shard_quiet(storage):
    """A consumer pulling one message at a time: a lock that filled its batch but says it took
    everything due (``LeasedBatch.drained``) is not followed by a lock that finds nothing."""
    hub = _hub(storage)
    quiet = Quiet("t.drained", 0, 1, 0.0, 1)
    calls = {"attempt": 0, "next_due": 0}
    batches = [LeasedBatch(["m1"], drained=True), LeasedBatch(["m2"], drained=False), LeasedBatch(["m3"])]

    def attempt():
        calls["attempt"] += 1
        return batches.pop(0) if batches else LeasedBatch(drained=True)

    def next_due():
        calls["next_due"] += 1
        return None

    def pull() -> InThread:
        return InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, next_due, "t.drained", quiet=quiet))

    try:
        assert pull().value(10) == ["m1"] and calls == {"attempt": 1, "next_due": 0}
        waiting = pull()
        wait_until(lambda: hub._waiters.get("t.drained"), 10, what="the second pull to wait")
        assert calls == {"attempt": 1, "next_due": 1}  # full, yet drained: no lock
        hub.notify("t.drained", clock.now())
        assert waiting.value(10) == ["m2"] and calls["attempt"] == 2
        assert pull().value(10) == ["m3"] and calls["attempt"] == 3  # not drained: it locks at once
    finally:
        hub.stop()


def test_a_commit_wakes_the_pull_of_its_shard_to_lock_and_the_others_to_read_the_next_due_time(storage):
    hub = _hub(storage)
    calls = {0: {"attempt": 0, "next_due": 0}, 1: {"attempt": 0, "next_due": 0}}
    due: dict = {0: None, 1: None}

    def pull(rank: int) -> InThread:
        def attempt():
            calls[rank]["attempt"] += 1
            return ["m"] if calls[rank]["attempt"] > 1 and due[rank] is not None else []

        def next_due():
            calls[rank]["next_due"] += 1
            return due[rank]

        quiet = Quiet("t.shards", rank, 2, 0.0, 5)
        return InThread(lambda: long_poll(hub, _monotonic_in(60), attempt, next_due, "t.shards", quiet=quiet))

    pulls = {rank: pull(rank) for rank in (0, 1)}
    try:
        wait_until(lambda: len(hub._waiters.get("t.shards", ())) == 2
                   and all(c == {"attempt": 1, "next_due": 1} for c in calls.values()), 10, what="both pulls asleep")
        due[0] = clock.now()
        hub.notify("t.shards", clock.now(), None, [4])  # id 4 is shard 0's (4 mod 2; step 1)
        assert pulls[0].value(10) == ["m"] and calls[0]["attempt"] == 2
        wait_until(lambda: calls[1]["next_due"] == 2 and hub._waiters.get("t.shards"), 10,
                   what="the other shard's pull to look and sleep again")
        assert calls[1]["attempt"] == 1  # it read the next due time only
        due[1] = clock.now()  # one of its own after all (a step not current, a retry): it locks
        hub.notify("t.shards", clock.now(), None, [6])
        assert pulls[1].value(10) == ["m"] and calls[1] == {"attempt": 2, "next_due": 3}
    finally:
        hub.stop()
        for p in pulls.values():
            p.join(10)


def test_a_pull_sleeps_until_the_next_due_time_of_its_shard(storage):
    hub = _hub(storage)
    calls: list[datetime] = []
    due = clock.after(clock.now(), 0.3)

    def attempt():
        calls.append(clock.now())
        return ["due"] if clock.now() >= due else []

    try:
        found = long_poll(hub, deadline=_monotonic_in(60), attempt=attempt, next_due=lambda: due, topic="t.due")
        assert found == ["due"]
        assert calls[-1] >= due and len(calls) <= 3  # woke for the due time, not by polling
    finally:
        hub.stop()


def test_a_finished_message_wakes_only_the_pulls_something_running_held_back(storage):
    """A success frees a serial topic's head or a flow-limited slot, nothing else: a pull that
    sleeps because nothing is due is not woken by acks (each wake costs two statements)."""
    hub = _hub(storage)
    attempts = {"idle": 0, "serial": 0, "blocked": 0}
    past = clock.after(clock.now(), -1)

    def poll(name: str, next_due, serial: bool = False) -> InThread:
        def attempt():
            attempts[name] += 1
            return []
        return InThread(long_poll, hub, _monotonic_in(60), attempt, next_due, "t.freed", 0.0, None, serial)

    polls = [poll("idle", lambda: None), poll("serial", lambda: None, serial=True), poll("blocked", lambda: past)]
    try:
        def all_asleep() -> bool:
            waiters = hub._waiters.get("t.freed", set())
            return len(waiters) == 3 and all(w.wake_at != datetime.max for w in waiters)

        wait_until(all_asleep, 10, what="three pulls asleep")
        assert attempts == {"idle": 1, "serial": 1, "blocked": 1}
        idle = next(w for w in hub._waiters["t.freed"] if not w.held)
        hub.notify_freed("t.freed")
        assert not idle.event.is_set()
        wait_until(lambda: attempts["serial"] == 2 and attempts["blocked"] == 2, 10,
                   what="the held pulls to look again")
        wait_until(all_asleep, 10, what="the held pulls asleep again")
        assert attempts["idle"] == 1
        hub.notify("t.freed", clock.now())  # something became due: every pull looks
        wait_until(lambda: attempts["idle"] == 2, 10, what="the idle pull to look")
    finally:
        hub.stop()
        for p in polls:
            p.join(10)


def _monotonic_in(seconds: float) -> float:
    return time.monotonic() + seconds


def _counted_looks(hub: PullHub) -> list[float]:
    """The monotonic time of each look of ``hub``'s insert watch from now on."""
    looks: list[float] = []
    real_look = hub._inserts.look

    def counted():
        looks.append(time.monotonic())
        return real_look()

    hub._inserts.look = counted  # type: ignore[method-assign]
    return looks


def test_the_insert_watch_looks_quicker_while_it_finds_rows_for_a_sleeping_pull(storage):
    """Rows committed elsewhere (here: straight into the storage, as another broker would)
    switch the watch to its busy interval while a pull sleeps here. While the pulls only lock
    (none sleeps), and once no rows come, it looks at the idle interval."""
    hub = PullHub(storage.probes, probe_interval=0.5, recheck=60, busy_interval=0.01)
    looks = _counted_looks(hub)
    locking = hub.register("t.watch", 0.0, None)  # a pull busy locking: the watch runs, nobody sleeps
    hub.start()
    stop = threading.Event()

    def insert_elsewhere():
        while not stop.wait(0.005):
            now = clock.now()
            storage.messages.insert_messages([NewRow("t.watch", "1", now, 0)], now)

    writer = InThread(insert_elsewhere)
    sleeping = sleeper = None
    try:
        wait_until(lambda: len(looks) >= 3, 10, what="the first looks, finding rows")
        # An observed absence needs a window: at the busy interval one second would hold 100 looks.
        before = len(looks)
        stop.wait(1.0)
        assert len(looks) - before <= 4
        # A pull begins to sleep: 20 more looks within 2 s (at the idle interval there would be 4).
        # Of another topic: the rows would wake a pull of their own, which would then lock.
        sleeping = hub.register("t.asleep", 0.0, None)
        sleeper = InThread(hub.sleep, sleeping, 60)
        busy_from = len(looks)
        wait_until(lambda: len(looks) >= busy_from + 20, 2, 0.005, what="20 looks while rows arrive")
        stop.set()
        writer.join(5)
        # Without rows the watch goes back to the idle interval: a gap of 0.3 s between looks.
        wait_until(lambda: time.monotonic() - looks[-1] > 0.3, 10, 0.01, what="the looks to slow down")
    finally:
        stop.set()
        hub.unregister(locking)
        hub.stop()
        if sleeping is not None:
            hub.unregister(sleeping)
            sleeper.value()


def test_a_pull_that_begins_to_sleep_while_looks_find_rows_brings_the_next_look_forward(storage):
    """Under load the watch looks slowly while every pull locks; the first pull to sleep must
    not wait out that interval for rows committed elsewhere."""
    hub = PullHub(storage.probes, probe_interval=30, recheck=60, busy_interval=0.01)
    looks = _counted_looks(hub)
    waiter = hub.register("t.soon", 0.0, None)
    hub.start()
    hub._found_at = time.monotonic()  # as if the last look had found rows committed elsewhere
    sleeper = InThread(hub.sleep, waiter, 60)
    try:
        wait_until(lambda: looks, 10, what="a look well before the 30 s interval")
    finally:
        hub.unregister(waiter)
        hub.stop()
        sleeper.value()
