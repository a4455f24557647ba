"""A topic's lock hints: raised by the probe, lowered by what this broker sees become NEW,
forgotten where it cannot know, and never raised over a lowering the probe may have missed."""

from __future__ import annotations

from tidemq import clock
from tidemq_broker import hints as hints_module
from tidemq_broker.hints import MARGIN, Arrival, LockHints, arrivals
from tidemq_broker.storage import LockHint


def _probe(hints: LockHints, found: dict, at=None) -> set:
    return hints.learn(hints.versions(hints.active()), found, at or clock.now())


def test_a_topic_reads_everything_until_a_probe_says_where_its_messages_are():
    hints = LockHints(stranded_after=1.0)
    assert hints.get("t") == LockHint(None, None, 1.0) and hints.active() == ["t"]
    now = clock.now()
    due = clock.after(now, -30)
    assert _probe(hints, {"t": {0: due, 4: clock.after(now, 60)}}, now) == set()  # stranded from the start
    assert hints.get("t") == LockHint(clock.after(due, -MARGIN), frozenset({0, 4}), 1.0)
    _probe(hints, {"t": {0: clock.after(now, -0.5)}}, now)  # due, but not past the grace
    assert hints.get("t") == LockHint(clock.after(now, -0.5 - MARGIN), frozenset({0}), 0.0)


def test_nothing_pending_sets_the_floor_at_the_probe_time_and_reads_no_range():
    hints = LockHints()
    hints.get("t")
    now = clock.now()
    _probe(hints, {}, now)
    assert hints.get("t") == LockHint(clock.after(now, -MARGIN), frozenset(), 0.0)
    _probe(hints, {"t": {9: clock.after(now, 3600)}}, now)  # delayed only: the floor stays at the probe
    assert hints.get("t").floor == clock.after(now, -MARGIN)


def test_what_becomes_new_lowers_the_floor_and_adds_its_priority_or_forgets_what_is_unknown():
    hints = LockHints()
    hints.get("t")
    now = clock.now()
    _probe(hints, {}, now)
    earlier = clock.after(now, -60)
    hints.lower("t", earlier, {3})
    assert hints.get("t").floor == earlier and hints.get("t").priorities == {3}
    hints.lower("t", now, ())  # later than the floor, no priority: a serial head freed
    assert hints.get("t").floor == earlier and hints.get("t").priorities == {3}
    hints.lower("t", now, None)  # a retry of a priority not known here
    assert hints.get("t").priorities is None and hints.get("t").floor == earlier
    hints.forget(["t"])
    assert hints.get("t") == LockHint(None, None, hints.stranded_after)


def test_a_probe_that_ran_across_a_lowering_does_not_raise_over_it():
    hints = LockHints()
    hints.get("t")
    now = clock.now()
    _probe(hints, {}, clock.after(now, -600))
    versions = hints.versions(["t"])  # a probe starts ...
    hints.lower("t", clock.after(now, -700), {0})  # ... a commit it cannot see lowers the floor ...
    hints.learn(versions, {}, now)  # ... and the probe's answer, without that message, is dropped
    assert hints.get("t").floor == clock.after(now, -700)
    _probe(hints, {"t": {0: clock.after(now, -700)}}, now)
    assert hints.get("t").floor == clock.after(now, -700 - MARGIN)


def test_a_probe_names_the_topics_whose_messages_just_became_stranded():
    hints = LockHints(stranded_after=1.0)
    hints.get("t")
    now = clock.now()
    _probe(hints, {"t": {0: now}}, now)
    assert hints.get("t").stranded == 0.0
    assert _probe(hints, {"t": {0: now}}, clock.after(now, 2)) == {"t"}
    assert hints.get("t").stranded == 1.0


def test_a_probe_that_ran_across_a_commit_still_marks_what_it_found_stranded():
    hints = LockHints(stranded_after=1.0)
    hints.get("t")
    now = clock.now()
    _probe(hints, {"t": {0: now}}, now)  # both consumers keep up: nothing stranded
    assert hints.get("t").stranded == 0.0
    versions = hints.versions(["t"])  # a probe starts ...
    hints.lower("t", clock.after(now, 2), {0})  # ... a producer's commit lands meanwhile ...
    # ... and a message of a dead consumer's shard, due 2 s before the probe, is still there.
    assert hints.learn(versions, {"t": {0: now}}, clock.after(now, 2)) == {"t"}
    assert hints.get("t").stranded == 1.0
    versions = hints.versions(["t"])
    hints.lower("t", clock.after(now, 3), {0})
    hints.learn(versions, {"t": {0: clock.after(now, 3)}}, clock.after(now, 3))  # may not clear it
    assert hints.get("t").stranded == 1.0
    _probe(hints, {"t": {0: clock.after(now, 3)}}, clock.after(now, 3))  # a probe across no commit does
    assert hints.get("t").stranded == 0.0


def test_the_probe_takes_a_bounded_share_of_the_time():
    assert LockHints.next_probe(0.001) == 0.5
    assert LockHints.next_probe(0.05) == 0.05 / 0.05
    assert LockHints.next_probe(3.0) == 2.0  # still often enough for stranded messages


def test_arrivals_name_the_earliest_time_and_every_priority_of_each_topic():
    now = clock.now()
    rows = [("a", 0, now), ("a", 5, clock.after(now, -1)), ("b", 2, clock.after(now, 3))]
    assert arrivals(rows) == {"a": Arrival(clock.after(now, -1), frozenset({0, 5})),
                              "b": Arrival(clock.after(now, 3), frozenset({2}))}


def test_topics_not_pulled_for_a_while_are_dropped(monkeypatch):
    hints = LockHints()
    hints.get("old")
    import tidemq_broker.hints as module

    real = module.time.monotonic
    monkeypatch.setattr(module.time, "monotonic", lambda: real() + 60)
    assert hints.active() == []
    assert hints.versions(["old"]) == {}


def test_a_probe_across_known_lowerings_learns_the_hint_widened_by_them():
    # Under steady production a commit lands during every probe: the hint must still be learnt.
    hints = LockHints(stranded_after=1.0)
    hints.get("t")
    now = clock.now()
    versions = hints.versions(["t"])
    hints.lower("t", clock.after(now, 5), {2})  # a delayed message committed during the probe
    hints.lower("t", clock.after(now, -2), {0})  # a due one: the earliest lowering
    hints.learn(versions, {"t": {0: clock.after(now, -0.5), 7: clock.after(now, 60)}}, now)
    assert hints.get("t").floor == clock.after(now, -2)  # below the probe's own floor
    assert hints.get("t").priorities == {0, 2, 7}
    versions = hints.versions(["t"])
    hints.lower("t", clock.after(now, 1), {0})
    hints.learn(versions, {"t": {0: now}}, now)
    # The probe's floor is below the lowering now; the priorities no longer pending are dropped.
    assert (hints.get("t").floor, hints.get("t").priorities) == (clock.after(now, -MARGIN), {0})


def test_a_probe_across_something_not_known_learns_nothing():
    hints = LockHints()
    hints.get("t")
    now = clock.now()
    for unknown in (lambda: hints.lower("t", now, None), lambda: hints.forget(["t"])):
        versions = hints.versions(["t"])
        hints.lower("t", now, {0})
        unknown()  # a retry of a priority not known here, or a change in bulk
        hints.learn(versions, {"t": {0: now}}, now)
        assert hints.get("t").floor is None and hints.get("t").priorities is None
    _probe(hints, {"t": {0: now}}, now)  # the next probe across no change learns it
    assert hints.get("t").priorities == {0}


def test_a_lock_moves_its_own_shards_cursor_and_no_other():
    hints = LockHints()
    now = clock.now()
    hints.get("t")
    _probe(hints, {"t": {0: clock.after(now, -10)}}, now)
    floor = hints.get("t").floor
    hint = hints.get("t", (0, 2))
    assert hint.floors == () and hint.floor_of(0) == floor
    hints.reached("t", (0, 2), hint, {0: clock.after(now, 1), 5: clock.after(now, -20)})
    mine = hints.get("t", (0, 2))
    assert mine.floors == ((0, clock.after(now, 1)),)  # 5's is below the floor: the floor reads less
    assert mine.floor_of(0) == clock.after(now, 1) and mine.floor_of(5) == floor
    assert hints.get("t", (1, 2)).floors == ()
    hints.reached("t", (0, 2), hint, {0: clock.after(now, 0.5)})  # an older lock's answer never moves it back
    assert hints.get("t", (0, 2)).floor_of(0) == clock.after(now, 1)


def test_what_becomes_new_lowers_every_cursor_and_caps_a_lock_that_ran_across_it():
    hints = LockHints()
    now = clock.now()
    hints.get("t")
    hint = hints.get("t", (0, 1))
    hints.reached("t", (0, 1), hint, {0: clock.after(now, 5), 3: clock.after(now, 5)})
    hints.lower("t", clock.after(now, 2), [3])
    assert dict(hints.get("t", (0, 1)).floors) == {0: clock.after(now, 5), 3: clock.after(now, 2)}
    # A lock that began before a lowering may not have seen what it made NEW.
    running = hints.get("t", (0, 1))
    hints.lower("t", clock.after(now, 4), [0])
    hints.reached("t", (0, 1), running, {0: clock.after(now, 9), 3: clock.after(now, 9)})
    assert dict(hints.get("t", (0, 1)).floors) == {0: clock.after(now, 4), 3: clock.after(now, 9)}
    running = hints.get("t", (0, 1))
    hints.lower("t", clock.after(now, 6), None)  # priority not known: caps every one
    hints.reached("t", (0, 1), running, {0: clock.after(now, 9), 3: clock.after(now, 9)})
    assert dict(hints.get("t", (0, 1)).floors) == {0: clock.after(now, 6), 3: clock.after(now, 6)}
    running = hints.get("t", (0, 1))
    hints.forget(["t"])  # times not known: no cursor is left, and the lock's answer is not taken
    hints.reached("t", (0, 1), running, {0: clock.after(now, 9)})
    assert hints.get("t", (0, 1)).floors == ()


def test_a_lock_across_more_lowerings_than_remembered_leaves_the_cursor():
    hints = LockHints()
    now = clock.now()
    hints.get("t")
    running = hints.get("t", (0, 1))
    for i in range(hints_module._LOG):
        hints.lower("t", clock.after(now, 5 + i), [0])
    hints.reached("t", (0, 1), running, {0: clock.after(now, 9)})  # every one remembered: capped by them
    assert hints.get("t", (0, 1)).floors == ((0, clock.after(now, 5)),)
    running = hints.get("t", (1, 2))
    for i in range(hints_module._LOG + 1):
        hints.lower("t", clock.after(now, 50 + i), [0])
    hints.reached("t", (1, 2), running, {0: clock.after(now, 9)})
    assert hints.get("t", (1, 2)).floors == ()


def test_the_probe_lowers_a_cursor_over_a_message_it_finds_below_it():
    """Another broker's retry or lease expiry, or the console's requeue, made it NEW unseen."""
    hints = LockHints()
    now = clock.now()
    hints.get("t")
    _probe(hints, {}, clock.after(now, -60))
    hint = hints.get("t", (1, 2))
    hints.reached("t", (1, 2), hint, {0: clock.after(now, 1), 2: clock.after(now, 1)})
    running = hints.get("t", (1, 2))
    _probe(hints, {"t": {0: clock.after(now, -3), 2: clock.after(now, 4)}}, now)
    assert hints.get("t").floor == clock.after(now, -3 - MARGIN)
    assert dict(hints.get("t", (1, 2)).floors) == {0: clock.after(now, -3), 2: clock.after(now, 1)}
    # A lock that ran across the probe cannot raise the cursor over what the probe found.
    hints.reached("t", (1, 2), running, {0: clock.after(now, 2)})
    assert hints.get("t", (1, 2)).floor_of(0) == clock.after(now, -3)
