"""The autocommit connections ``SqlDatabase`` keeps per kind of work (``storages.database._Kept``):
an idle connection is handed out before a slot without one, a slot given back empty does not
hide the open ones, and a caller waits for a slot only as long as it was told."""

from __future__ import annotations

import threading
import time

import pytest

from tidemq_broker.storages.database import _Kept


def test_an_idle_connection_goes_out_before_an_empty_slot_whatever_came_back_last():
    kept = _Kept(3)
    assert kept.take(1) is None  # nothing open yet: a slot to fill
    kept.give("a")
    assert kept.take(1) == "a"
    assert kept.take(1) is None  # "a" is out: a second slot, whose connect then fails
    kept.give("a")
    kept.give(None)  # came back last, empty
    assert [kept.take(1), kept.take(1), kept.take(1)] == ["a", None, None]


def test_the_most_recently_used_connection_goes_out_first():
    kept = _Kept(3)
    assert [kept.take(1), kept.take(1)] == [None, None]
    kept.give("old")
    kept.give("new")
    assert kept.take(1) == "new"


def test_with_every_slot_in_use_a_caller_waits_its_time_then_gets_a_timeout():
    kept = _Kept(1)
    assert kept.take(1) is None
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="in use for 0.2 s"):
        kept.take(0.2)
    assert time.monotonic() - started >= 0.2


def test_a_slot_given_back_wakes_a_waiting_caller():
    kept = _Kept(1)
    assert kept.take(1) is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(kept.take(10)))
    waiter.start()
    kept.give("a")
    waiter.join(10)
    assert got == ["a"]


def test_idle_takes_the_open_connections_out_and_leaves_their_slots_empty():
    kept = _Kept(2)
    assert [kept.take(1), kept.take(1)] == [None, None]
    kept.give("a")
    kept.give("b")
    assert sorted(kept.idle()) == ["a", "b"]
    assert [kept.take(1), kept.take(1)] == [None, None]
