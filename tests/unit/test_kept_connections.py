"""The autocommit connections ``SqlDatabase`` keeps per kind of work (``storages.kept.Kept``):
an idle connection is handed out before a slot without one, a slot given back empty does not
hide the open ones, and a caller waits for a slot only as long as it was told; on a
full server, an idle connection is given up to the pool or traded for a slot whose connect
was refused."""

from __future__ import annotations

import threading
import time

import pytest

from tidemq_broker.storages.kept import Kept


def test_an_idle_connection_goes_out_before_an_empty_slot_whatever_came_back_last():
    kept = Kept(3)
    assert kept.take(1) is None  # nothing open yet: a slot to fill
    kept.give("a")
    assert kept.take(1) == "a"
    assert kept.take(1) is None  # "a" is out: a second slot, whose connect then fails
    kept.give("a")
    kept.give(None)  # came back last, empty
    assert [kept.take(1), kept.take(1), kept.take(1)] == ["a", None, None]


def test_the_most_recently_used_connection_goes_out_first():
    kept = Kept(3)
    assert [kept.take(1), kept.take(1)] == [None, None]
    kept.give("old")
    kept.give("new")
    assert kept.take(1) == "new"


def test_with_every_slot_in_use_a_caller_waits_its_time_then_gets_a_timeout():
    kept = Kept(1)
    assert kept.take(1) is None
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="in use for 0.2 s"):
        kept.take(0.2)
    assert time.monotonic() - started >= 0.2


def test_a_slot_given_back_wakes_a_waiting_caller():
    kept = Kept(1)
    assert kept.take(1) is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(kept.take(10)))
    waiter.start()
    kept.give("a")
    waiter.join(10)
    assert got == ["a"]


def test_idle_takes_the_open_connections_out_and_leaves_their_slots_empty():
    kept = Kept(2)
    assert [kept.take(1), kept.take(1)] == [None, None]
    kept.give("a")
    kept.give("b")
    assert sorted(kept.idle()) == ["a", "b"]
    assert [kept.take(1), kept.take(1)] == [None, None]


def test_surrender_gives_up_the_least_recently_used_idle_connection_and_empties_its_slot():
    kept = Kept(2)
    assert [kept.take(1), kept.take(1)] == [None, None]
    kept.give("old")
    kept.give("new")
    assert kept.surrender() == "old"
    assert [kept.take(1), kept.take(1)] == ["new", None]  # its slot is free, to be filled again
    assert kept.surrender() is None  # nothing idle: nothing to give up
    with pytest.raises(TimeoutError):
        kept.take(0.01)


def test_a_slot_whose_connect_was_refused_trades_for_a_connection_given_back_meanwhile():
    kept = Kept(2)
    assert kept.take(1) is None
    kept.give("a")
    assert kept.take(1) == "a"  # in use by another unit of work
    assert kept.take(1) is None  # an empty slot, whose connect the full server refuses
    got = []
    trader = threading.Thread(target=lambda: got.append(kept.trade(10)))
    trader.start()
    kept.give("a")
    trader.join(10)
    assert got == ["a"]
    kept.give(got[0])  # the traded connection back: both slots free, one open, one empty
    assert [kept.take(1), kept.take(1)] == ["a", None]


def test_a_trade_that_finds_nothing_within_its_time_keeps_the_empty_slot():
    kept = Kept(1)
    assert kept.take(1) is None
    started = time.monotonic()
    assert kept.trade(0.1) is None
    assert time.monotonic() - started >= 0.1
    with pytest.raises(TimeoutError):  # the caller still holds the only slot
        kept.take(0.01)
    kept.give(None)
    assert kept.take(1) is None
