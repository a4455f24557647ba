"""The lock hints (``tidemq_broker.hints``) on a real broker: they never strand a message.

A message can become NEW below the floor without this broker seeing it (another broker's release
or retry, the console's requeue); the broker's once-a-second probe must find it.
"""

from __future__ import annotations

import time

from tests.background import InThread
from tests.servers import wait_until
from tidemq import BatchConsumer, clock
from tidemq_broker.storage import LockRequest, Shard


def test_a_message_released_elsewhere_below_the_floor_is_still_delivered(client, broker):
    consumer = BatchConsumer("t.floor.audit", client=client)
    [first] = [client.produce("t.floor.audit", {"n": 0})]
    assert [m.id for m in consumer.pull(max_messages=1, wait=10.0)] == [first]
    consumer.ack(succeeded=[first])
    msg_id = client.produce("t.floor.audit", {"n": 1})
    # Leased and released behind the broker's back, as another broker would.
    [leased] = broker.storage.leases.lock_batch(LockRequest(Shard("t.floor.audit"), "elsewhere", 60, clock.now(),
                                                            limit=1))
    assert leased.id == msg_id
    pull = InThread(lambda: consumer.pull(max_messages=1, wait=30.0))
    wait_until(lambda: broker.hub._waiters.get("t.floor.audit"), 10, what="a waiting pull")
    # The probe sees nothing pending and raises the floor past the message's effect time.
    wait_until(lambda: (broker.hub.hints.get("t.floor.audit").floor or leased.effect_time) > leased.effect_time, 10,
               what="the floor to pass the leased message")
    broker.storage.leases.release(leased.lease_token, clock.now(), "elsewhere")
    released = time.monotonic()
    [got] = pull.value(30)
    # Functional bound: the probe runs every second; a floor nobody corrects would strand it.
    assert got.id == msg_id and time.monotonic() - released < 5.0


def test_a_message_stored_through_another_broker_below_a_shards_cursor_is_delivered(two_brokers, clients):
    """The pulling broker's probe is off: only its watch of other brokers' inserts can lower the
    shard's cursor, which its earlier locks moved past the new message's effect time."""
    near, far = clients
    hub = two_brokers[0].hub
    hub._earliest_every = 10**9
    topic = "t.cursor.elsewhere"
    consumer = BatchConsumer(topic, client=near)
    first = near.produce(topic, {"n": 0})
    assert [m.id for m in consumer.pull(max_messages=1, wait=10.0)] == [first]
    consumer.ack(succeeded=[first])

    def cursor_at_due_by() -> bool:
        # Read to the end: the cursor is at the lock's due-by time. The insert watch's first
        # look of a new broker (it comes with the first pull) forgets every cursor, as it
        # cannot know what was stored before it: after it, the next lock leaves one again.
        assert consumer.pull(max_messages=1, wait=0) == []
        hint = hub.hints.get(topic)
        assert hint.floor is None
        return hint.floor_of(0) is not None and hint.floor_of(0) > clock.after(clock.now(), -1)

    wait_until(cursor_at_due_by, 10, what="the shard's cursor at its due-by time")
    late = far.produce(topic, {"n": 1}, effect_time=clock.after(clock.now(), -60))
    [got] = consumer.pull(max_messages=1, wait=30.0)
    assert got.id == late


def test_a_step_released_by_an_ack_here_is_delivered_past_the_shards_cursor(client, broker):
    """The probe is off: the ack's own notification must lower the cursor to the released step's
    effect time (the ack's time), not to the time after its commit. The pulls lease 5 s ahead,
    as workers do, so their cursor is 5 s past the ack's time."""
    broker.hub._earliest_every = 10**9
    parent = client.produce("t.cursor.parent", {"n": 0})
    child = client.produce("t.cursor.child", {"n": 1}, depends_on=[parent])

    def cursor_ahead() -> bool:
        # A lock that ran across a lowering it cannot place (the insert watch's first look of a
        # new broker forgets what it does not know yet) leaves no cursor: the next one does.
        assert client.pull("t.cursor.child", "c", wait=0, ahead=5.0) == []
        cursor = broker.hub.hints.get("t.cursor.child").floor_of(0)
        return cursor is not None and cursor > clock.after(clock.now(), 4)

    wait_until(cursor_ahead, 10, what="the shard's cursor 5 s from now")
    waiting = InThread(lambda: client.pull("t.cursor.child", "c", max_messages=1, wait=30.0, ahead=5.0))
    wait_until(lambda: broker.hub.waiting("t.cursor.child") == 1, 10, what="the child's pull waiting")
    parents = BatchConsumer("t.cursor.parent", client=client)
    [got] = parents.pull(max_messages=1, wait=10.0)
    parents.ack(succeeded=[got.id])
    [released] = waiting.value(40)
    assert released.id == child


def test_a_lease_expired_by_the_leader_reaches_a_pull_waiting_on_the_other_broker(two_brokers, clients):
    """The expired lease's message is NEW again at its old effect time, below the shard's cursor
    the other broker's locks left. Its probe and its pulls' recheck are off, so only the leader's
    signal (``UNTIMED``: forget the topic's hint) can bring it to the waiting pull, which would
    otherwise end empty at its deadline."""
    wait_until(lambda: any(b.maintainer.is_leader.is_set() for b in two_brokers), 30, what="a maintenance leader")
    other = 1 if two_brokers[0].maintainer.is_leader.is_set() else 0
    hub, client = two_brokers[other].hub, clients[other]
    hub._earliest_every, hub.recheck = 10**9, 600.0
    topic = "t.cursor.expired"
    msg_id = client.produce(topic, {"n": 1})
    [held] = client.pull(topic, "dies", max_messages=1, wait=10.0, ttr=3.0)  # and never acks
    assert held.id == msg_id

    def cursor_at_due_by() -> bool:  # as above
        assert client.pull(topic, "c", max_messages=1, wait=0) == []
        cursor = hub.hints.get(topic).floor_of(0)
        return cursor is not None and cursor > clock.after(clock.now(), -1)

    wait_until(cursor_at_due_by, 10, what="the shard's cursor at its due-by time")
    waiting = InThread(lambda: client.pull(topic, "c", max_messages=1, wait=30.0))
    wait_until(lambda: hub.waiting(topic) == 1, 10, what="the pull waiting on the other broker")
    [again] = waiting.value(40)
    assert again.id == msg_id and again.attempt == 2
