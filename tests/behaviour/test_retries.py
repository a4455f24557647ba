"""Handler failures: retries after the schedule's or the topic's delay, FAIL once none are left,
and requeue of dead letters. Each scenario runs against the StubBroker and a real broker."""

from __future__ import annotations

from tidemq.link import AckOutcome

from .scenario import ack, pull, seconds

APPLIED = [AckOutcome.APPLIED]


def test_a_failure_retries_after_its_schedules_delay_and_fails_once_no_retry_is_left(double):
    msg_id = double.link.produce("t", {"n": 1}, retry=[0, 1.0])
    [first] = pull(double, "t")
    assert (first.attempt, first.retry_remaining) == (1, 2)
    assert ack(double, "t", [first], error="boom") == APPLIED
    [second] = pull(double, "t")  # the schedule's first delay is 0: due at once
    assert (second.attempt, second.retry_remaining) == (2, 1)
    failed_at = double.now()
    assert ack(double, "t", [second], error="boom again") == APPLIED
    waiting = double.stored(msg_id)
    assert (waiting.status, waiting.retry_remaining) == ("NEW", 0)
    assert 0.99 <= seconds(waiting.effect_time - failed_at) < 1.5
    assert pull(double, "t") == []  # not before its effect time
    [third] = pull(double, "t", wait=5)
    assert third.attempt == 3 and double.now() >= waiting.effect_time
    assert ack(double, "t", [third], error="still broken") == APPLIED
    dead = double.stored(msg_id)
    assert dead.status == "FAIL"
    assert dead.events == ("PRODUCED", "LOCKED", "RETRY", "LOCKED", "RETRY", "LOCKED", "FAIL")
    assert dead.errors == ("boom", "boom_again", "still_broken")


def test_a_retry_count_waits_the_topics_exponential_backoff_with_jitter(double):
    double.set_topic("t", retry_base=0.2, retry_max=0.3)
    msg_id = double.link.produce("t", None, retry=2)
    waits = []
    for attempt in (1, 2):
        [d] = pull(double, "t", wait=5)
        assert d.attempt == attempt
        failed_at = double.now()
        ack(double, "t", [d], error=f"attempt {attempt}")
        waits.append(seconds(double.stored(msg_id).effect_time - failed_at))
    # next_delay: base * 2**(attempt - 1), at most retry_max, times a jitter in [0.5, 1].
    assert 0.099 <= waits[0] <= 0.2 + 0.3
    assert 0.149 <= waits[1] <= 0.3 + 0.3
    [last] = pull(double, "t", wait=5)
    ack(double, "t", [last], error="attempt 3")
    assert double.stored(msg_id).status == "FAIL"


def test_a_message_produced_without_retry_gets_the_topics_retry_count(double):
    double.set_topic("t", retry_count=1, retry_base=0.0)
    msg_id = double.link.produce("t", "x")
    [d] = pull(double, "t")
    assert d.retry_remaining == 1
    ack(double, "t", [d], error="once")
    [again] = pull(double, "t", wait=5)
    ack(double, "t", [again], error="twice")
    assert double.stored(msg_id).status == "FAIL"


def test_a_dead_letter_is_requeued_by_id_or_by_topic_with_new_retries(double):
    first, second = double.link.produce_many("t", [1, 2], retry=0)
    pending = double.link.produce("t", 3, delay=3600)
    deliveries = pull(double, "t")
    assert ack(double, "t", deliveries, error="no") == APPLIED * 2
    assert [double.stored(i).status for i in (first, second)] == ["FAIL", "FAIL"]
    assert double.link.requeue([first], retry=1) == 1
    assert double.link.requeue([first]) == 0  # NEW now: only FAIL messages are requeued
    requeued = double.stored(first)
    assert (requeued.status, requeued.retry_remaining, requeued.events[-1]) == ("NEW", 1, "REQUEUED")
    assert double.link.requeue(topic="t") == 1  # the other dead letter; the pending one is NEW
    assert double.stored(pending).status == "NEW"
    again = pull(double, "t")
    assert sorted((d.id, d.attempt) for d in again) == [(first, 2), (second, 2)]
    assert ack(double, "t", again) == APPLIED * 2
    assert double.stored(first).status == "SUCCESS"
