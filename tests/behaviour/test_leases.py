"""Leases: expiry back to NEW, FAIL after max_deliveries, stale and repeated acks, release,
heartbeats. Each scenario runs against the StubBroker and a real broker."""

from __future__ import annotations

import pytest

from tidemq.errors import MalformedRequestError
from tidemq.limits import new_lease_token
from tidemq.link import AckItem, AckOutcome, LeaseRef

from .scenario import CONSUMER, ack, pull, seconds

APPLIED, STALE = AckOutcome.APPLIED, AckOutcome.STALE


def test_an_expired_lease_returns_the_message_and_its_holders_ack_is_refused(double):
    msg_id = double.link.produce("t", "x")
    [lost] = pull(double, "t", ttr=1)
    double.run_out_leases([msg_id])
    back = double.stored(msg_id)
    assert (back.status, back.attempt, back.events[-1]) == ("NEW", 1, "LEASE_EXPIRED")
    assert ack(double, "t", [lost]) == [STALE]
    assert double.stored(msg_id).status == "NEW"  # the late ack changed nothing
    [again] = pull(double, "t")
    assert again.attempt == 2 and again.lease_token != lost.lease_token
    assert ack(double, "t", [again]) == [APPLIED]
    assert double.stored(msg_id).events == ("PRODUCED", "LOCKED", "LEASE_EXPIRED", "LOCKED", "SUCCESS")


def test_a_message_whose_lease_expires_max_deliveries_times_fails_as_poison(double):
    double.set_topic("t", max_deliveries=2)
    msg_id = double.link.produce("t", "poison", retry=5)
    for attempt in (1, 2):
        [d] = pull(double, "t", ttr=1)
        assert d.attempt == attempt
        double.run_out_leases([msg_id])
    dead = double.stored(msg_id)
    assert (dead.status, dead.retry_remaining) == ("FAIL", 5)  # handler retries are not spent
    assert dead.events == ("PRODUCED", "LOCKED", "LEASE_EXPIRED", "LOCKED", "FAIL")
    assert dead.errors[-1].startswith("lease_expired_2_times")


def test_acks_are_applied_only_under_the_lease_they_name_and_a_repeat_is_answered_as_recorded(double):
    ok, bad, running = double.link.produce_many("t", [1, 2, 3], retry=0)
    held = {d.id: d for d in pull(double, "t")}
    other = new_lease_token()
    assert double.link.ack("t", CONSUMER, [AckItem(running, other, True)]) == [STALE]
    assert double.stored(running).status == "RUNNING"
    assert ack(double, "t", [held[ok]]) == [APPLIED]
    assert ack(double, "t", [held[bad]], error="no") == [APPLIED]
    # Sent again (its reply was lost): answered applied, changing nothing.
    assert ack(double, "t", [held[ok]]) == [APPLIED]
    assert ack(double, "t", [held[bad]], error="no") == [APPLIED]
    assert ack(double, "t", [held[bad]]) == [STALE]  # not the outcome it ended with
    assert double.link.ack("t", CONSUMER, [AckItem(10_000, other, True)]) == [STALE]  # no such message
    assert [double.stored(i).status for i in (ok, bad, running)] == ["SUCCESS", "FAIL", "RUNNING"]
    assert double.stored(ok).events.count("SUCCESS") == 1


def test_a_release_gives_the_leased_messages_back_without_counting_an_attempt(double):
    ids = double.link.produce_many("t", [1, 2, 3])
    token = new_lease_token()
    assert len(pull(double, "t", lease_token=token)) == 3
    assert double.link.release(token, CONSUMER) == 3
    assert double.link.release(token, CONSUMER) == 0
    assert {(double.stored(i).status, double.stored(i).attempt) for i in ids} == {("NEW", 0)}
    assert double.stored(ids[0]).events == ("PRODUCED", "LOCKED", "RELEASED")
    assert {d.attempt for d in pull(double, "t")} == {1}
    with pytest.raises(MalformedRequestError, match="32 lowercase hex"):
        double.link.release("not-a-token", CONSUMER)


def test_heartbeats_and_touch_extend_only_a_lease_still_held(double):
    msg_id, done = double.link.produce_many("t", [1, 2])
    leases = {d.id: d for d in pull(double, "t", ttr=30)}
    held, finished = LeaseRef(msg_id, leases[msg_id].lease_token), LeaseRef(done, leases[done].lease_token)
    ack(double, "t", [leases[done]])
    before = double.now()
    assert double.link.extend([held, finished, LeaseRef(msg_id, new_lease_token())], 120, CONSUMER) == \
        [True, False, False]
    assert 119 <= seconds(double.stored(msg_id).lease_expire - before) <= 121
    assert double.link.touch(msg_id, held.lease_token, 600)
    assert 599 <= seconds(double.stored(msg_id).lease_expire - before) <= 601
    assert not double.link.touch(done, finished.lease_token, 600)
    assert double.stored(msg_id).events == ("PRODUCED", "LOCKED")  # extensions write no trace line
