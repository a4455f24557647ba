"""A topic's floor: where its lock starts reading. Raised by the probe, lowered by what this
broker sees become NEW, and never raised over a lowering that the probe may have missed."""

from __future__ import annotations

from tidemq import clock
from tidemq_broker.floors import MARGIN, Floors


def test_a_topic_has_no_floor_until_a_probe_finds_one():
    floors = Floors()
    assert floors.get("t") is None and floors.active() == ["t"]
    now = clock.now()
    due = clock.after(now, -30)
    floors.learn(floors.versions(["t"]), {"t": due}, now)
    assert floors.get("t") == clock.after(due, -MARGIN)


def test_nothing_pending_sets_the_floor_at_the_probe_time():
    floors = Floors()
    floors.get("t")
    now = clock.now()
    floors.learn(floors.versions(["t"]), {}, now)
    assert floors.get("t") == clock.after(now, -MARGIN)
    later = clock.after(now, 3600)  # delayed messages only: the floor stays at the probe's time
    floors.learn(floors.versions(["t"]), {"t": later}, now)
    assert floors.get("t") == clock.after(now, -MARGIN)


def test_a_message_below_the_floor_lowers_it_and_an_unknown_time_forgets_it():
    floors = Floors()
    floors.get("t")
    now = clock.now()
    floors.learn(floors.versions(["t"]), {}, now)
    earlier = clock.after(now, -60)
    floors.lower("t", earlier)
    assert floors.get("t") == earlier
    floors.lower("t", now)  # later than the floor: nothing to do
    assert floors.get("t") == earlier
    floors.forget(["t"])
    assert floors.get("t") is None


def test_a_probe_that_ran_across_a_lowering_does_not_raise_over_it():
    floors = Floors()
    floors.get("t")
    now = clock.now()
    floors.learn(floors.versions(["t"]), {}, clock.after(now, -600))
    versions = floors.versions(["t"])  # a probe starts ...
    floors.lower("t", clock.after(now, -700))  # ... a commit it cannot see lowers the floor ...
    floors.learn(versions, {}, now)  # ... and the probe's answer, without that message, is dropped
    assert floors.get("t") == clock.after(now, -700)
    floors.learn(floors.versions(["t"]), {"t": clock.after(now, -700)}, now)
    assert floors.get("t") == clock.after(now, -700 - MARGIN)


def test_topics_not_pulled_for_a_while_are_dropped(monkeypatch):
    floors = Floors()
    floors.get("old")
    import tidemq_broker.floors as module

    real = module.time.monotonic
    monkeypatch.setattr(module.time, "monotonic", lambda: real() + 60)
    assert floors.active() == []
    assert floors.versions(["old"]) == {"old": 0}
