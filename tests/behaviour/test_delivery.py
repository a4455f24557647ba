"""What a pull hands out and when: priority order, delays, leases taken ahead, QUEUE shards,
SERIAL_QUEUE order, paused topics. Each scenario runs against the StubBroker and a real broker."""

from __future__ import annotations

from datetime import timedelta, timezone

from .scenario import ack, pull, seconds


def test_due_messages_are_leased_highest_priority_first_then_oldest(double):
    ids = [double.link.produce("t", n, priority=p) for n, p in enumerate([0, 5, 9, 5, 0])]
    assert [d.id for d in pull(double, "t", max_messages=2)] == [ids[2], ids[1]]
    assert [d.id for d in pull(double, "t")] == [ids[3], ids[0], ids[4]]


def test_a_delayed_message_is_not_delivered_before_its_effect_time(double):
    before = double.now()
    msg_id = double.link.produce("t", "later", delay=0.5)
    due = double.stored(msg_id).effect_time
    assert 0.499 <= seconds(due - before) < 1.0
    assert pull(double, "t") == []
    [d] = pull(double, "t", wait=5)
    assert d.id == msg_id and double.now() >= due
    assert d.effect_time == due.replace(tzinfo=timezone.utc)


def test_an_effect_time_in_the_past_is_due_at_once_and_one_ahead_waits(double):
    now = double.now().replace(tzinfo=timezone.utc)
    past = double.link.produce("t", "past", effect_time=now - timedelta(hours=1))
    future = double.link.produce("t", "future", effect_time=now + timedelta(hours=1))
    assert [d.id for d in pull(double, "t")] == [past]
    assert double.stored(future).effect_time == (now + timedelta(hours=1)).replace(tzinfo=None)


def test_a_pull_with_ahead_leases_a_message_due_within_it_for_the_wait_plus_its_ttr(double):
    msg_id = double.link.produce("t", "soon", delay=3)
    far = double.link.produce("t", "later", delay=60)
    [d] = pull(double, "t", ahead=5, ttr=30)
    assert d.id == msg_id and d.effect_time > double.now().replace(tzinfo=timezone.utc)  # handed out early
    leased = double.stored(msg_id)
    assert 34 <= seconds(leased.lease_expire - double.now()) <= 35.5  # ahead + ttr from the lease
    assert double.stored(far).status == "NEW"


def test_a_queue_pull_takes_only_its_shard(double):
    ids = double.link.produce_many("t", list(range(6)))
    got = pull(double, "t", rank=1, total=2)
    assert [d.id for d in got] == [i for i in ids if i % 2 == 1]


def test_a_serial_topic_runs_one_message_at_a_time_in_order_and_a_retry_keeps_its_place(double):
    head, second, third = double.link.produce_many("s", [1, 2, 3], retry=[0.5])
    [d] = pull(double, "s", serial=True)
    assert d.id == head
    assert pull(double, "s", serial=True) == []  # the head is RUNNING
    ack(double, "s", [d], error="not yet")
    assert pull(double, "s", serial=True) == []  # the head waits for its retry; nothing passes it
    [again] = pull(double, "s", serial=True, wait=5)
    assert (again.id, again.attempt) == (head, 2)
    ack(double, "s", [again])
    assert [d.id for d in pull(double, "s", serial=True)] == [second]


def test_a_paused_topic_hands_out_nothing_until_resumed(double):
    msg_id = double.link.produce("t", 1)
    double.set_topic("t", paused=True)
    assert pull(double, "t") == []
    double.set_topic("t", paused=False)
    assert [d.id for d in pull(double, "t")] == [msg_id]
