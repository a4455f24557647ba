"""Schedules in every storage (memory, SQLite, MariaDB, Galera): declaring, pausing, ticking, and a tick stored
once when the leader dies between producing it and recording it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from tests.observe import all_messages
from tests.servers import wait_until
from tidemq import clock
from tidemq_broker.maintenance.schedules import ScheduleTicks
from tidemq_broker.schedules import check_schedule, unique_key


@pytest.fixture
def storage(any_storage):
    return any_storage


def test_put_is_an_idempotent_upsert_that_keeps_progress(storage):
    now = clock.now()
    s = check_schedule("nightly", "t.sched", "0 3 * * *", {"k": 1}, "Europe/Berlin", "skip", 2)
    assert storage.schedules.put_schedule(s, now) is True
    assert storage.schedules.advance_schedule("nightly", now + timedelta(hours=1))
    assert storage.schedules.put_schedule(s,
                                          now + timedelta(seconds=5)) is False  # declared again by a restarted worker
    [stored] = storage.schedules.list_schedules()
    assert (stored.topic, stored.cron, stored.timezone, stored.data, stored.missed, stored.retry, stored.paused) == \
        ("t.sched", "0 3 * * *", "Europe/Berlin", '{"k":1}', "skip", 2, False)
    assert stored.ticks_from == now and stored.last_tick == now + timedelta(hours=1)
    # A new expression starts its ticks afresh instead of catching up the old one's.
    later = now + timedelta(seconds=9)
    storage.schedules.put_schedule(dataclasses.replace(s, cron="0 4 * * *"), later)
    changed = storage.schedules.get_schedule("nightly")
    assert changed.cron == "0 4 * * *" and changed.ticks_from == later and changed.last_tick is None
    assert storage.schedules.get_schedule("other") is None


def test_advance_never_moves_back_and_pause_resume_delete(storage):
    now = clock.now()
    storage.schedules.put_schedule(check_schedule("s", "t.sched", "* * * * *"), now)
    assert storage.schedules.advance_schedule("s", now + timedelta(minutes=2))
    assert not storage.schedules.advance_schedule("s", now + timedelta(minutes=1))  # a stale leader's round
    assert storage.schedules.get_schedule("s").last_tick == now + timedelta(minutes=2)
    assert storage.schedules.pause_schedule("s", True, now) and storage.schedules.get_schedule("s").paused
    resumed_at = now + timedelta(hours=1)
    assert storage.schedules.pause_schedule("s", False, resumed_at)
    resumed = storage.schedules.get_schedule("s")
    assert not resumed.paused and resumed.ticks_from == resumed_at  # the paused hour is not caught up
    assert not storage.schedules.pause_schedule("missing", True, now)
    assert storage.schedules.delete_schedule("s") and not storage.schedules.delete_schedule("s")
    assert storage.schedules.list_schedules() == []


class _DiesBeforeRecording:
    """Schedules whose leader is killed after producing a tick and before recording it."""

    def __init__(self, schedules):
        self._schedules = schedules

    def __getattr__(self, name):
        return getattr(self._schedules, name)

    def advance_schedule(self, name, tick):
        raise SystemExit("killed")


def _produce(storage):
    return lambda rows: storage.messages.insert_messages(rows, clock.now())


def test_a_tick_produced_by_a_dead_leader_is_not_stored_twice(storage):
    start = clock.now() - timedelta(seconds=3.5)
    storage.schedules.put_schedule(check_schedule("every", "t.every", "* * * * * *", {"n": 1}), start)
    dying = ScheduleTicks(_DiesBeforeRecording(storage.schedules), _produce(storage), lambda topic: 0)
    with pytest.raises(SystemExit):
        dying.run()  # SystemExit is no Exception: the round dies as the process would
    first = {m.unique_key: m.id for m in _messages(storage, "t.every")}
    assert len(first) >= 3
    # The next leader produces the same ticks again (nothing recorded them) and more.
    assert ScheduleTicks(storage.schedules, _produce(storage), lambda topic: 0).run() >= 3
    after = {m.unique_key: m.id for m in _messages(storage, "t.every")}
    assert {k: after[k] for k in first} == first  # the same messages, not new ones
    ticks = sorted(m.effect_time for m in _messages(storage, "t.every"))
    assert len(ticks) == len(set(ticks)) and all(t.microsecond == 0 for t in ticks)
    assert all(b - a == timedelta(seconds=1) for a, b in zip(ticks, ticks[1:]))  # no gap
    last = storage.schedules.get_schedule("every").last_tick
    assert last == ticks[-1] and unique_key("every", last) in after
    assert ScheduleTicks(storage.schedules, _produce(storage),
                         lambda topic: 0).run() <= 1  # at most a new second's tick


def test_the_table_is_read_every_reload_seconds_not_every_round(storage):
    reads = []

    class Counting:
        def __getattr__(self, name):
            return getattr(storage.schedules, name)

        def list_schedules(self):
            reads.append(1)
            return storage.schedules.list_schedules()

    start = clock.now() - timedelta(seconds=1.5)
    storage.schedules.put_schedule(check_schedule("every", "t.reads", "* * * * * *"), start)
    job = ScheduleTicks(Counting(), _produce(storage), lambda topic: 0, reload=3600)
    assert job.run() >= 1
    # Ticks go on from the job's own copy, which it advances itself: no tick twice, none read again.
    wait_until(lambda: job.run() >= 1, 5, 0.05, what="the next second's tick from the copy")
    assert len(reads) == 1
    ticks = [m.effect_time for m in _messages(storage, "t.reads")]
    assert len(ticks) == len(set(ticks)) >= 2
    job.stop_leading()
    job.run()
    assert len(reads) == 2  # a new term starts from the table


def test_paused_schedules_produce_nothing_and_retry_defaults_to_the_topic(storage):
    start = clock.now() - timedelta(seconds=2.5)
    storage.schedules.put_schedule(check_schedule("p", "t.paused", "* * * * * *"), start)
    storage.schedules.put_schedule(check_schedule("r", "t.retry", "* * * * * *"), start)
    storage.schedules.pause_schedule("p", True, start)
    assert ScheduleTicks(storage.schedules, _produce(storage), lambda topic: 7).run() >= 2
    assert _messages(storage, "t.paused") == []
    assert {m.retry_remaining for m in _messages(storage, "t.retry")} == {7}


def _messages(storage, topic):
    return all_messages(storage, topic)


def test_a_round_skips_schedules_whose_next_tick_has_not_come(storage, monkeypatch):
    from tidemq_broker.maintenance import schedules as job_module

    storage.schedules.put_schedule(check_schedule("later", "t.later", "0 0 1 1 *"), clock.now())
    job = ScheduleTicks(storage.schedules, _produce(storage), lambda topic: 0, reload=0)
    assert job.run() == 0
    real, calls = job_module.due_ticks, []
    monkeypatch.setattr(job_module, "due_ticks", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert job.run() == 0 and calls == []  # next January: nothing to compute until then
    storage.schedules.put_schedule(check_schedule("later", "t.later", "* * * * * *"), clock.now())
    # A changed row is computed again: its first tick comes within a second.
    wait_until(lambda: job.run() >= 1, 5, 0.05, what="the new expression's first tick")
    assert calls
